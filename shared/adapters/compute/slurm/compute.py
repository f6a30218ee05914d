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
and reported, and an operator's resume of mtc's drain is noticed (``drains``). Repairs: RESET_GPU,
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
emits ``JobCheckpointSaved`` for each new checkpoint (``protocol.checkpoint_steps``) and
``JobWorkersExited`` once per attempt: when every rank left an exit code, or when the Slurm
job ended or was requeued by Slurm itself without them (missing ranks count 137). An mtc
attempt is one Slurm job run: a job Slurm requeues on its own (node failure) is cancelled and
mtc starts the next attempt. The jobs run in a partition ``mtc`` (created with ``scontrol
create`` over the nodes mtc may use) because Slurm jobs cannot span partitions and a
replacement cloud node must be able to join static ones. ``signal_workers`` =
``scancel --signal=TERM`` (steps only: the training processes get it, the batch shell does
not), then ``scancel`` after the grace period; ``stop_workers`` = ``scancel``.

Warm processes (``warm=True``; ``warm``, the ``WarmProcesses`` port): the job's allocation
outlives its attempts, an in-place, hot-swap or scale-down attempt onto nodes it holds runs as
one more step in it, and a rank whose program restarts in process is held instead of
signalled and goes on in its process in the next attempt. Every attempt is still recorded.

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

Layout, one concern a collaborator, each built with the frozen ``SlurmSettings`` and the
shared pieces it needs, all holding one ``FactStore`` (the state file and its fact outbox) and
one ``SlurmView`` (the last observation of Slurm): ``ops`` (the operation queue; each
collaborator registers the operations it owns), ``agents`` (the node agents), ``drains``
(whose drain it is), ``nodes`` (mapping, cordons, repairs, provisioning), ``attempts``
(attempts as batch jobs; scripts by ``scripts``), ``userjobs`` (the jobs users submit with
plain ``sbatch``), ``deep_checks`` (maintenance reservations) and this module (the port:
construction, observing Slurm, ``poll``). ``api`` is what is read from and asked of Slurm.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtc_program.peer_store import DEFAULT_BUDGET_BYTES
from shared.adapters.compute.disk_evidence import space
from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.slurm.agents import SlurmAgents
from shared.adapters.compute.slurm.api import SlurmApi, SlurmControl
from shared.adapters.compute.slurm.attempts import SlurmAttempts
from shared.adapters.compute.slurm.cli import SlurmError, SlurmJob, SlurmTransientError
from shared.adapters.compute.slurm.deep_checks import DEEP_SCHEMA, SlurmDeepChecks
from shared.adapters.compute.slurm.drains import SlurmDrains, migrate_drains
from shared.adapters.compute.slurm.nodes import SlurmNodes
from shared.adapters.compute.slurm.ops import Alert, OpQueue, log
from shared.adapters.compute.slurm.reservations import DeepCheckSpec
from shared.adapters.compute.slurm.settings import SlurmSettings
from shared.adapters.compute.slurm.userjobs import SlurmUserJobs, migrate_user_jobs
from shared.adapters.compute.slurm.view import SlurmView
from shared.adapters.compute.slurm.warm import WARM_SCHEMA
from shared.adapters.compute.worker_logs import LogFile
from shared.domain.health import RepairAction
from shared.domain.model import Node
from shared.domain.storage import StorageFloor
from shared.ports import Clock, Emitter, Gang
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



class SlurmCompute:
    """The ``Compute`` port over a real Slurm cluster (see the module docstring), with the
    ``DeepChecks`` capability. It holds its collaborators and delegates to them."""

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
        storage_floor: StorageFloor | None = None,
        peer_budget_bytes: int = DEFAULT_BUDGET_BYTES,
        warm: bool = False,
        park_s: float = 20.0,
        gang_grace_s: float = 30.0,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.slurm_conf = slurm_conf
        self.cli: SlurmApi = cli or SlurmControl(timeout_s=command_timeout_s, slurm_conf=slurm_conf)
        if deep_check_spec is None or isinstance(deep_check_spec, Mapping):
            deep_check_spec = DeepCheckSpec.from_dict({"slurm_conf": slurm_conf,
                                                       **(deep_check_spec or {})})
        default_user = (partition,) if partition else ()
        self.settings = SlurmSettings(
            state_dir=self.state_dir,
            partition=partition,
            allowed=tuple(slurm_nodes) if slurm_nodes is not None else None,
            python=shutil.which(python) or python,
            agent_interval_s=agent_interval_s,
            agent_probes=tuple(agent_probes),
            agent_runner=agent_runner,
            agent_command_timeout_s=agent_command_timeout_s,
            observe_interval_s=observe_interval_s,
            provision_timeout_s=provision_timeout_s,
            repair_timeout_s=repair_timeout_s,
            retry_initial_s=retry_initial_s,
            retry_max_s=retry_max_s,
            master_addr=master_addr,
            user_partitions=(tuple(user_job_partitions) if user_job_partitions is not None
                             else default_user),
            deep_check_spec=deep_check_spec,
            deep_check_runner=deep_check_runner or agent_runner,
            storage_floor=storage_floor or StorageFloor(),
            peer_budget_bytes=peer_budget_bytes,
            warm=warm,
            park_s=park_s,
            gang_grace_s=gang_grace_s,
        )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = FactStore(self.state_dir / self.DB_FILE, _SCHEMA + DEEP_SCHEMA + WARM_SCHEMA,
                               emit, clock)
        migrate_drains(self.store)
        migrate_user_jobs(self.store)
        with self.store.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('instance', ?)", (os.urandom(3).hex(),)
            )
            self.instance: str = db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0]
        settings, store = self.settings, self.store
        self.view = SlurmView(up_since=clock.now())
        self.ops = OpQueue(settings, store, self.view)
        self.agents = SlurmAgents(settings, store, self.view)
        self.drains = SlurmDrains(store, self.view, self.cli, self.ops)
        self.nodes = SlurmNodes(settings, store, self.view, self.cli, self.ops, self.agents)
        self.attempts = SlurmAttempts(settings, store, self.view, self.cli, self.ops, self.instance)
        self.user_jobs = SlurmUserJobs(settings, store, self.view, self.cli, self.ops,
                                       self.attempts)
        self.deep_checks = SlurmDeepChecks(settings, store, self.view, self.cli)
        self.deep_checks.resume()

    @property
    def partition(self) -> str | None:
        return self.settings.partition

    @property
    def deep_check_spec(self) -> DeepCheckSpec:
        return self.settings.deep_check_spec

    # ------------------------------------------------------------ the port

    def provision_node(self, node: Node) -> None:
        self.nodes.provision_node(node)

    def cordon(self, node_id: str, reason: str) -> None:
        self.nodes.cordon(node_id, reason)

    def uncordon(self, node_id: str) -> None:
        self.nodes.uncordon(node_id)

    def delete_node(self, node_id: str) -> None:
        self.nodes.delete_node(node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        self.nodes.start_repair(node_id, action, attempt)

    def start_workers(self, gang: Gang) -> None:
        self.attempts.start_workers(gang)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        self.attempts.signal_workers(job_id, attempt, grace_s)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self.attempts.stop_workers(job_id, attempt)

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """The ``DeepChecks`` capability: once per (node, attempt), in a reservation."""
        self.deep_checks.start_deep_check(node_id, attempt)

    # ------------------------------------------------------------ what tests, demos, the CLI read

    def alerts(self) -> list[Alert]:
        """What a person should look at: Slurm unreachable, commands that failed."""
        return self.ops.alerts()

    def slurm_node_of(self, node_id: str) -> str | None:
        return self.nodes.slurm_node_of(node_id)

    def node_id_of(self, slurm_node: str) -> str | None:
        return self.nodes.node_id_of(slurm_node)

    def mapping(self) -> dict[str, str]:
        return self.nodes.mapping()

    def inject_xid(self, node_id: str, xid: int = 79, **line: Any) -> Path:
        return self.nodes.inject_xid(node_id, xid, **line)

    def node_dir(self, slurm_node: str) -> Path:
        return self.agents.node_dir(slurm_node)

    def kernel_log(self, slurm_node: str) -> Path:
        return self.agents.kernel_log(slurm_node)

    def scratch_dir(self, slurm_node: str) -> Path:
        return self.agents.scratch_dir(slurm_node)

    def job_log(self, job_id: str) -> Path:
        return self.attempts.job_log(job_id)

    def log_files(self, job_id: str) -> list[LogFile]:
        return self.attempts.log_files(job_id)

    def run_dir(self, job_id: str, attempt: int) -> Path:
        return self.attempts.run_dir(job_id, attempt)

    def slurm_job_id(self, job_id: str, attempt: int) -> int | None:
        return self.attempts.slurm_job_id(job_id, attempt)

    def kill_all(self, wait_s: float = 15.0) -> None:
        self.attempts.kill_all(wait_s)

    def user_job(self, job: SlurmJob) -> bool:
        return self.user_jobs.user_job(job)

    def storage_space(self, path: str) -> tuple[int, int] | None:
        """The ``StorageSpace`` capability: the shared file system of a job's files, as the
        controller's machine mounts it (the ranks' launchers read it on their nodes)."""
        return space(path)

    def close(self) -> None:
        """Close the state file. Workers and jobs keep running: they outlive this object."""
        self.store.close()

    # ------------------------------------------------------------ poll

    def observe(self, *, force: bool = False) -> bool:
        """Refresh the view of Slurm (``sinfo``/``squeue``) at most every
        ``observe_interval_s``; returns whether the view is fresh."""
        view = self.view
        now = self.store.clock.now()
        interval = self.settings.observe_interval_s
        if view.down_since is not None:  # back off: each try may wait for a timeout
            interval = min(self.settings.retry_max_s, max(interval, (now - view.down_since) / 2))
        if not force and now - view.observed_at < interval:
            return view.fresh
        view.observed_at = now
        try:
            records = self.cli.node_records()
            jobs = self.cli.jobs()
        except SlurmTransientError as exc:
            view.fresh = False
            self.ops.controller_down(str(exc))
            return False
        except SlurmError as exc:
            view.fresh = False
            log.error("reading Slurm state failed: %s", exc)
            return False
        view.records = {r.name: r for r in records}
        view.jobs = {j.job_id: j for j in jobs}
        view.fresh = True
        self.ops.controller_up()
        return True

    def poll(self) -> None:
        """Turn what happened in Slurm since the last poll into events (once each), retry
        pending commands whose backoff ran out, and run the node agents that are due."""
        fresh = self.observe()
        now = self.store.clock.now()
        if fresh and self.partition and not self.view.partition_ready:
            try:
                self.attempts.ensure_partition()
            except SlurmError as exc:
                log.warning("cannot create Slurm partition %s yet: %s", self.partition, exc)
        keys: list[str] = []
        with self.store.tx() as db:
            if fresh:
                keys += self.nodes.assign_pending(db, now)
                self.nodes.observe_provisioning(db, now)
                self.nodes.observe_repairs(db, now)
                keys += self.drains.observe(db, now)
                keys += self.user_jobs.observe(db, now)
            keys += self.attempts.observe(db, now, fresh)
            self.deep_checks.report(db, now)
        if keys or self.view.down_since is None:
            self.ops.run()  # what this poll asked for, and retries whose backoff ran out
        self.store.drain()
        self.agents.tick(now)
