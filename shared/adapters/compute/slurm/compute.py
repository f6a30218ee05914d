"""Compute over a real Slurm cluster: mtc decides, Slurm runs it.

``SlurmCompute`` implements the ``Compute`` port with the Slurm commands of ``SlurmCli``
(Slurm 22.05 here). mtc keeps placement and the repair decisions; Slurm runs the jobs and owns
the nodes' state, so ``sinfo``/``squeue`` show every step of a self-healing cycle.

Mapping. An mtc node id (``demo-h100-000``) is mapped to a Slurm node name (``n1``) in this
adapter's own sqlite state (like ``LocalCompute``). ``provision_node`` takes a free static node
(idle, in service, not used by another mtc node), or powers up a power-saving ``CLOUD`` node
when no static node is free or when the node replaces another (``node.replaces`` is set). The
node is drained ("mtc: ... running its first checks") until it passes its checks, and
``NodeProvisioned`` is emitted once ``sinfo`` shows its slurmd up. A login node needs no Slurm
node: it is the host that runs slurmctld.

Nodes. ``cordon`` = ``scontrol update state=drain reason="mtc: ..."``, ``uncordon`` = ``state=
resume``, only of a node whose current reason is mtc's own: drains made by others are kept
and reported, and an operator's resume of mtc's drain is noticed (``slurm_drains``). Repairs: RESET_GPU,
REBOOT and REIMAGE all become ``scontrol reboot`` of the drained
node (there is no GPU to reset here; the cluster's RebootProgram restarts that node's slurmd
with ``-b``). The reboot is issued *without* ``ASAP``/``nextstate``: Slurm 22.05 clears DRAIN
after an ASAP or ``nextstate=resume`` reboot, and a ``nextstate=down`` node comes back by itself
under ``ReturnToService=2``; a plain reboot of a drained node waits for its jobs to end (as
ASAP does) and leaves it DRAINED, so it only returns once mtc's checks pass (``uncordon``).
The repair completes when ``slurmd_start_time`` changed and slurmd answers again: the node's
kernel log is rotated (a new boot has a new log), REIMAGE also wipes the node's scratch
directory, ``NodeRepairCompleted`` is emitted, then a post-repair ``NodeHealthReported`` from a
full run of the node agent's probes on that node. REPLACE (when asked through
``start_repair``; the repair service usually retires the node and provisions a replacement
instead) powers the bad node down and powers a cloud node up under the same mtc id.
``delete_node`` releases a healthy node (resumed if mtc drained it), and powers down a node
that mtc cordoned for a fault (it leaves the fleet) or that mtc powered up.

The node agent. Each node's agent is ``shared.probes.agent.collect`` run every
``agent_interval_s`` by ``poll()`` for that node (the same probes and HealthReport that
``mtc-agent --interval N --publish-url URL`` would post from the node; on this one-host cluster
every "node" is this host, so running them in the controller saves a process per node). Its
XID source is the node's own kernel log, ``<state_dir>/nodes/<slurm node>/kern.log``: a test
injects a fault by appending one NVIDIA driver line to it (``inject_xid`` writes
``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., GPU has fallen off the bus.``). Tools
missing here (nvidia-smi, dcgmi, a speed baseline) give ``unknown`` conditions, never "ok".
An agent is silent while its node is down, powered down or rebooting (its heartbeat then
lapses, as a dead node's would) and while a repair of the node is under way.

Jobs. ``start_workers`` submits one batch job per attempt: ``sbatch --requeue
--open-mode=append --exclusive --nodelist=<mapped nodes> -N k -p mtc`` running one ``srun``
task per node, task r on the node of rank r (``--distribution=arbitrary`` with a hostfile).
Each task runs its worker pool's command with the worker protocol's environment
(``protocol``), ``RANK=$SLURM_PROCID``, ``MTC_NODE_ID`` from ``$SLURMD_NODENAME`` and
``CLUSTER_SPEC``'s task (its pool and index in it) filled in to match, under
``worker_launcher``, which leaves each rank's exit code in ``rank-<RANK>.exit``. ``poll()``
emits ``JobCheckpointSaved`` for each new ``ckpt-<step>`` (``protocol.checkpoint_steps``) and
``JobWorkersExited`` once per attempt: when every rank left an exit code, or when the Slurm
job ended or was requeued by Slurm itself without them (missing ranks count 137). An mtc
attempt is one Slurm job run: a job Slurm requeues on its own (node failure) is cancelled and
mtc starts the next attempt. The jobs run in a partition ``mtc`` (created with ``scontrol
create`` over the nodes mtc may use) because Slurm jobs cannot span partitions and a
replacement cloud node must be able to join static ones. ``signal_workers`` =
``scancel --signal=TERM`` (steps only: the training processes get it, the batch shell does
not), then ``scancel`` after the grace period; ``stop_workers`` = ``scancel``.

Failures. Every Slurm command runs under a timeout. Each port call records what it wants as
an operation keyed by its idempotency key (a repeat is a no-op) and runs it at once; a
transient error (slurmctld down or slow) leaves it pending: ``poll()`` retries it with
exponential backoff and an alert (``alerts()``, and a log warning) is raised, and while the
controller is unreachable nothing is inferred from missing answers (no job is declared dead,
no repair or provisioning times out, no node is reported), so an outage never drains or
fails the fleet. Port calls never raise a Slurm error into a handler. A permanent error ends
the operation with an alert and, where a result is awaited, a failed result event (a repair
that failed, a provisioning that failed, workers that exited with code 1).

All state is in ``<state_dir>/slurm_compute.sqlite3``; facts are emitted once each through the
fact outbox, and attempts, checkpoints and repairs follow the shared ledger, as in
``LocalCompute``. The run, log and node directories must be on a file system every Slurm node
sees (trivially true here).

Layout, one concern a module, stacked as mixins (each layer uses the ones below it):
``slurm_api`` (what is read from and asked of Slurm), ``slurm_ops`` (the operation queue and
the shared state), ``slurm_agents`` (the node agents), ``slurm_drains`` (whose drain it is),
``slurm_nodes`` (mapping, cordons,
repairs, provisioning), ``slurm_scripts`` (the batch scripts), ``slurm_attempts`` (attempts as
batch jobs), ``slurm_userjobs`` (the jobs users submit with plain ``sbatch``) and this
module (the port: construction, observing Slurm, ``poll``).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.adapters.compute.slurm.api import NodeRecord, SlurmApi, SlurmControl
from shared.adapters.compute.slurm.cli import SlurmError, SlurmJob, SlurmTransientError
from shared.adapters.compute.slurm.ops import log
from shared.adapters.compute.slurm.deep_checks import DEEP_SCHEMA, DeepCheckSpec, SlurmDeepChecks
from shared.adapters.compute.slurm.userjobs import SlurmUserJobs
from shared.ports import Clock, Emitter
from shared.probes.agent import AgentState
from shared.probes.commands import Runner as ProbeRunner
from shared.probes.commands import run_command
from shared.probes.config import ALL_PROBES

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY, role TEXT NOT NULL, machine_type TEXT NOT NULL,
    slurm_node TEXT, cloud INTEGER NOT NULL DEFAULT 0, wants_cloud INTEGER NOT NULL DEFAULT 0,
    requested_at REAL NOT NULL, assigned_at REAL, provisioned INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0, cordon TEXT, cordon_reason TEXT NOT NULL DEFAULT '',
    next_report_at REAL, alerted INTEGER NOT NULL DEFAULT 0, mtc_drain TEXT, drained_at REAL,
    foreign_reason TEXT, foreign_since REAL);
CREATE TABLE IF NOT EXISTS repairs (
    node_id TEXT NOT NULL, attempt INTEGER NOT NULL, action TEXT NOT NULL, slurm_node TEXT,
    started_at REAL NOT NULL, boot_before INTEGER, issued_at REAL, completed_at REAL,
    PRIMARY KEY (node_id, attempt));
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, world_size INTEGER NOT NULL,
    slurm_nodes TEXT NOT NULL, checkpoint_dir TEXT NOT NULL, run_dir TEXT NOT NULL,
    output TEXT NOT NULL, slurm_job_id INTEGER, started_at REAL NOT NULL, signalled_at REAL,
    kill_deadline REAL, cancel_sent INTEGER NOT NULL DEFAULT 0,
    finalized INTEGER NOT NULL DEFAULT 0, gone_since REAL, PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS ops (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,
    status TEXT NOT NULL, tries INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,
    claimed_at REAL, error TEXT NOT NULL DEFAULT '', updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
    subject TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class SlurmCompute(SlurmDeepChecks, SlurmUserJobs):
    """The ``Compute`` port over a real Slurm cluster (see the module docstring)."""

    DB_FILE = "slurm_compute.sqlite3"

    def __init__(
        self,
        state_dir: Path,
        emit: Emitter,
        clock: Clock,
        *,
        slurm_conf: str | None = None,
        cli: SlurmApi | None = None,
        command_timeout_s: float = 10.0,
        partition: str | None = "mtc",
        slurm_nodes: Sequence[str] | None = None,
        python: str = sys.executable,
        agent_interval_s: float = 1.0,
        agent_probes: Sequence[str] = ALL_PROBES,
        agent_runner: ProbeRunner = run_command,
        agent_command_timeout_s: float = 10.0,
        observe_interval_s: float = 0.25,
        provision_timeout_s: float = 120.0,
        repair_timeout_s: float = 180.0,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        master_addr: str = "127.0.0.1",
        user_job_partitions: Sequence[str] | None = None,
        deep_check_spec: DeepCheckSpec | Mapping[str, Any] | None = None,
        deep_check_runner: ProbeRunner | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self._emit = emit
        self._clock = clock
        self.slurm_conf = slurm_conf
        self.cli: SlurmApi = cli or SlurmControl(timeout_s=command_timeout_s, slurm_conf=slurm_conf)
        self.partition = partition
        self._allowed = tuple(slurm_nodes) if slurm_nodes is not None else None
        self._python = shutil.which(python) or python
        self._agent_interval = agent_interval_s
        self._probes = tuple(agent_probes)
        self._agent_runner = agent_runner
        self._agent_timeout = agent_command_timeout_s
        self._observe_interval = observe_interval_s
        self._provision_timeout = provision_timeout_s
        self._repair_timeout = repair_timeout_s
        self._retry_initial = retry_initial_s
        self._retry_max = retry_max_s
        self._master_addr = master_addr
        if deep_check_spec is None or isinstance(deep_check_spec, Mapping):
            deep_check_spec = DeepCheckSpec.from_dict({"slurm_conf": slurm_conf,
                                                       **(deep_check_spec or {})})
        self.deep_check_spec = deep_check_spec
        self._deep_runner = deep_check_runner or agent_runner
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._agents: dict[str, AgentState] = {}
        self._view: dict[str, NodeRecord] = {}
        self._jobs: dict[int, SlurmJob] = {}
        self._observed_at = float("-inf")
        self._fresh = False  # the last observation succeeded
        self._down_since: float | None = None  # slurmctld unreachable since
        self._up_since = clock.now()  # timeouts do not run while Slurm cannot be asked
        self._partition_ready = False
        # where users' own sbatch jobs are adopted and healed (slurm_userjobs); () for none
        default_user = (partition,) if partition else ()
        self._user_partitions = (tuple(user_job_partitions) if user_job_partitions is not None
                                 else default_user)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._init_state(_SCHEMA + DEEP_SCHEMA)
        self._migrate_drains()
        self._migrate_user_jobs()
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('instance', ?)", (os.urandom(3).hex(),)
            )
            self.instance: str = db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0]
        self._resume_deep_checks()


    # ------------------------------------------------------------ poll

    def observe(self, *, force: bool = False) -> bool:
        """Refresh the view of Slurm (``sinfo``/``squeue``) at most every
        ``observe_interval_s``; returns whether the view is fresh."""
        now = self._clock.now()
        interval = self._observe_interval
        if self._down_since is not None:  # back off: each try may wait for a timeout
            interval = min(self._retry_max, max(interval, (now - self._down_since) / 2))
        if not force and now - self._observed_at < interval:
            return self._fresh
        self._observed_at = now
        try:
            records = self.cli.node_records()
            jobs = self.cli.jobs()
        except SlurmTransientError as exc:
            self._fresh = False
            self._controller_down(str(exc))
            return False
        except SlurmError as exc:
            self._fresh = False
            log.error("reading Slurm state failed: %s", exc)
            return False
        self._view = {r.name: r for r in records}
        self._jobs = {j.job_id: j for j in jobs}
        self._fresh = True
        self._controller_up()
        return True

    def poll(self) -> None:
        """Turn what happened in Slurm since the last poll into events (once each), retry
        pending commands whose backoff ran out, and run the node agents that are due."""
        fresh = self.observe()
        now = self._clock.now()
        if fresh and self.partition and not self._partition_ready:
            try:
                self._ensure_partition()
            except SlurmError as exc:
                log.warning("cannot create Slurm partition %s yet: %s", self.partition, exc)
        keys: list[str] = []
        with self._tx() as db:
            if fresh:
                keys += self._assign_pending(db, now)
                self._observe_provisioning(db, now)
                self._observe_repairs(db, now)
                keys += self._observe_drains(db, now)
                keys += self._observe_user_jobs(db, now)
            keys += self._observe_attempts(db, now, fresh)
            self._report_deep_checks(db, now)
        if keys or self._down_since is None:
            self._run_ops()  # what this poll asked for, and retries whose backoff ran out
        self._drain()
        self._agent_tick(now)


