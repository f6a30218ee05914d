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
resume``. Repairs: RESET_GPU, REBOOT and REIMAGE all become ``scontrol reboot`` of the drained
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
task per node. Each task gets the environment ``LocalCompute.worker_env`` gives a replica, with
``RANK=$SLURM_PROCID``, ``MTC_NODE_ID`` from ``$SLURMD_NODENAME`` and ``CLUSTER_SPEC``'s task
filled in to match (Slurm, not mtc, decides which node gets which task id), and runs under
``worker_launcher``, which leaves each rank's exit code in ``rank-<RANK>.exit``. ``poll()``
emits ``JobCheckpointSaved`` for each new ``ckpt-<step>`` (``local_compute``'s scan) and
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

All state is in ``<state_dir>/slurm_compute.sqlite3``; facts are emitted once each through a
small outbox, as in ``LocalCompute``. The run, log and node directories must be on a file
system every Slurm node sees (trivially true here).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from shared.adapters.compute.fact_state import FactState
from shared.adapters.compute.local_compute import (
    EXIT_KILLED,
    LAUNCHER,
    checkpoint_steps,
    managed_env,
    read_exit_file,
    safe_name,
)
from shared.adapters.compute.slurm_cli import (
    SlurmCli,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmPermanentError,
    SlurmTransientError,
)
from shared.domain.events import (
    Event,
    JobCheckpointSaved,
    JobWorkersExited,
    NodeHealthReported,
    NodeProvisioned,
    NodeRepairCompleted,
)
from shared.domain.health import HealthReport, RepairAction
from shared.domain.model import Node, NodeRole
from shared.ports import Clock, WorkerSpec
from shared.probes.agent import AgentState, collect
from shared.probes.commands import Runner as ProbeRunner
from shared.probes.commands import run_command
from shared.probes.config import ALL_PROBES, AgentConfig

log = logging.getLogger("mtc.compute.slurm")

RA = RepairAction
REBOOTS = frozenset({RA.RESET_GPU, RA.REBOOT, RA.REIMAGE})
EXIT_SUBMIT_FAILED = 1
TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)
REQUEUED_JOB_STATES = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# slurmd not running or not answering: the node's agent is silent, nothing can run there
NOT_UP_FLAGS = frozenset(
    {"NOT_RESPONDING", "POWERED_DOWN", "POWERING_UP", "POWERING_DOWN", "POWER_DOWN", "REBOOT_ISSUED"}
)
NOT_UP_STATES = frozenset({"down", "unknown", "future", "error"})
OP_LEASE_S = 60.0  # an operation claimed by a process that died is run again after this
JOB_GONE_SETTLE_S = 1.0  # exit files land before the task ends; allow for a slow file system
DEFAULT_XID_LINE = "NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name={name}, {text}"
XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted",
}


# --------------------------------------------------------------------------- Slurm side


@dataclass(frozen=True)
class NodeRecord:
    """A Slurm node as ``sinfo --json`` shows it, with the slurmd start time (a reboot
    changes it), which ``SlurmNode`` does not carry."""

    node: SlurmNode
    slurmd_start_time: int = 0

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.node.state_flags)

    @property
    def cloud(self) -> bool:
        return "CLOUD" in self.flags

    @property
    def up(self) -> bool:
        """slurmd registered and answering (drained or busy counts as up)."""
        return self.node.state not in NOT_UP_STATES and not self.flags & NOT_UP_FLAGS

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"})


def _plain_int(value: Any) -> int:
    if isinstance(value, Mapping):  # Slurm >= 23.02: {"set": true, "number": N}
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value)


class SlurmControl(SlurmCli):
    """``SlurmCli`` as this adapter reads it: node records carry the slurmd start time, and a
    repair reboot keeps the node drained until mtc's own checks pass."""

    def node_records(self) -> list[NodeRecord]:
        return [NodeRecord(n, n.slurmd_start_time) for n in self.nodes()]

    def reboot_keep_drain(self, node: str, reason: str) -> None:
        self.reboot(node, reason, keep_drained=True)


class SlurmApi(Protocol):
    """What SlurmCompute uses of Slurm (``SlurmControl``; unit tests pass a fake)."""

    def node_records(self) -> list[NodeRecord]: ...
    def jobs(self) -> list[SlurmJob]: ...
    def drain(self, node: str, reason: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def reboot_keep_drain(self, node: str, reason: str) -> None: ...
    def power_up(self, node: str) -> None: ...
    def power_down(self, node: str) -> None: ...
    def ensure_partition(self, name: str, nodes: str = "ALL") -> None: ...
    def signal_job(self, job_id: int, signal: str = "TERM", full: bool = False) -> None: ...
    def cancel(self, job_id: int) -> None: ...
    def submit(
        self,
        script_path: str,
        *,
        nodes: int,
        job_name: str,
        env: Mapping[str, str] | None = None,
        requeue: bool = True,
        open_mode: str = "append",
        output: str | None = None,
        partition: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> int: ...


def job_name(job_id: str, attempt: int, instance: str) -> str:
    """The Slurm job name of an mtc attempt; also how a lost sbatch answer is found again.
    ``instance`` tells apart control planes (state dirs) sharing one Slurm cluster."""
    return f"mtc-{job_id}-a{attempt}-{instance}"


def xid_line(
    xid: int, *, pci: str = "0000:3b:00", pid: int = 4242, name: str = "python3", text: str | None = None
) -> str:
    """One kernel log line in the NVIDIA driver's format (what ``inject_xid`` appends)."""
    body = text or XID_TEXT.get(xid, "injected by mtc")
    return DEFAULT_XID_LINE.format(pci=pci, xid=xid, pid=pid, name=name, text=body) + "\n"


# --------------------------------------------------------------------------- state

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY, role TEXT NOT NULL, machine_type TEXT NOT NULL,
    slurm_node TEXT, cloud INTEGER NOT NULL DEFAULT 0, wants_cloud INTEGER NOT NULL DEFAULT 0,
    requested_at REAL NOT NULL, assigned_at REAL, provisioned INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0, cordon TEXT, cordon_reason TEXT NOT NULL DEFAULT '',
    next_report_at REAL, alerted INTEGER NOT NULL DEFAULT 0);
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
CREATE TABLE IF NOT EXISTS checkpoints (
    checkpoint_dir TEXT NOT NULL, step INTEGER NOT NULL, job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, path TEXT NOT NULL, seen_at REAL NOT NULL,
    PRIMARY KEY (checkpoint_dir, step));
CREATE TABLE IF NOT EXISTS ops (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, kind TEXT NOT NULL, args TEXT NOT NULL,
    status TEXT NOT NULL, tries INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,
    claimed_at REAL, error TEXT NOT NULL DEFAULT '', updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
    subject TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL, data TEXT NOT NULL,
    claimed_at REAL);
"""


@dataclass
class _OpResult:
    ok: bool
    transient: bool = False
    error: str = ""
    quiet: bool = False  # waiting on another operation, not a failure worth an alert
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    at: float
    kind: str
    subject: str
    detail: str


class SlurmCompute(FactState):
    """The ``Compute`` port over a real Slurm cluster (see the module docstring)."""

    DB_FILE = "slurm_compute.sqlite3"

    def __init__(
        self,
        state_dir: Path,
        emit: Callable[[Event], None],
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
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._connect().executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('instance', ?)", (os.urandom(3).hex(),)
            )
            self.instance: str = db.execute("SELECT value FROM meta WHERE key = 'instance'").fetchone()[0]

    # ------------------------------------------------------------ plumbing

    def _alert(self, db: sqlite3.Connection, kind: str, subject: str, detail: str) -> None:
        log.warning("ALERT %s %s: %s", kind, subject, detail)
        db.execute(
            "INSERT INTO alerts (at, kind, subject, detail) VALUES (?, ?, ?, ?)",
            (self._clock.now(), kind, subject, detail[:1000]),
        )

    def alerts(self) -> list[Alert]:
        """What a person should look at: Slurm unreachable, commands that failed."""
        with self._tx() as db:
            rows = db.execute("SELECT * FROM alerts ORDER BY id").fetchall()
        return [Alert(r["at"], r["kind"], r["subject"], r["detail"]) for r in rows]

    # ------------------------------------------------------------ paths

    def node_dir(self, slurm_node: str) -> Path:
        return self.state_dir / "nodes" / safe_name(slurm_node)

    def kernel_log(self, slurm_node: str) -> Path:
        """The node's kernel log: the XID source its agent reads."""
        return self.node_dir(slurm_node) / "kern.log"

    def scratch_dir(self, slurm_node: str) -> Path:
        return self.node_dir(slurm_node) / "scratch"

    def job_log(self, job_id: str) -> Path:
        """Every attempt's Slurm output, appended (``--open-mode=append``)."""
        return self.state_dir / "logs" / safe_name(job_id) / "slurm.out"

    def run_dir(self, job_id: str, attempt: int) -> Path:
        return self.state_dir / "run" / safe_name(job_id) / f"attempt-{attempt}"

    # ------------------------------------------------------------ lookups

    def slurm_node_of(self, node_id: str) -> str | None:
        """The Slurm node an mtc node runs on now (None: not assigned, or deleted)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT slurm_node FROM nodes WHERE node_id = ? AND deleted = 0", (node_id,)
            ).fetchone()
        return None if row is None else cast("str | None", row["slurm_node"])

    def node_id_of(self, slurm_node: str) -> str | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT node_id FROM nodes WHERE slurm_node = ? AND deleted = 0", (slurm_node,)
            ).fetchone()
        return None if row is None else cast(str, row["node_id"])

    def mapping(self) -> dict[str, str]:
        """mtc node id -> Slurm node name, for nodes in use."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT node_id, slurm_node FROM nodes WHERE deleted = 0 AND slurm_node IS NOT NULL"
                " ORDER BY node_id"
            ).fetchall()
        return {r["node_id"]: r["slurm_node"] for r in rows}

    def slurm_job_id(self, job_id: str, attempt: int) -> int | None:
        with self._tx() as db:
            row = db.execute(
                "SELECT slurm_job_id FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
            ).fetchone()
        return None if row is None else cast("int | None", row["slurm_job_id"])

    def inject_xid(self, node_id: str, xid: int = 79, **line: Any) -> Path:
        """Append an XID line to the node's kernel log, as the driver would (tests, demo)."""
        slurm_node = self.slurm_node_of(node_id)
        if slurm_node is None:
            raise LookupError(f"node {node_id!r} has no Slurm node")
        path = self.kernel_log(slurm_node)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(xid_line(xid, **line))
        return path

    # ------------------------------------------------------------ operations

    def _put_op(
        self, db: sqlite3.Connection, key: str, kind: str, args: Mapping[str, Any], *, replace: bool = False
    ) -> bool:
        """Record an operation under its idempotency key. ``replace``: a desired state (the
        newest wins) rather than a one-off action. Returns whether there is work to do."""
        now = self._clock.now()
        text = json.dumps(dict(args), sort_keys=True)
        row = db.execute("SELECT kind, args, status FROM ops WHERE key = ?", (key,)).fetchone()
        if row is not None:
            if not replace:
                return False
            if row["kind"] == kind and row["args"] == text and row["status"] != "failed":
                return False
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM ops").fetchone()[0]
        db.execute(
            "INSERT INTO ops (key, seq, kind, args, status, tries, next_at, claimed_at, error,"
            " updated_at) VALUES (?, ?, ?, ?, 'pending', 0, ?, NULL, '', ?)"
            " ON CONFLICT(key) DO UPDATE SET seq = excluded.seq, kind = excluded.kind,"
            " args = excluded.args, status = 'pending', tries = 0, next_at = excluded.next_at,"
            " claimed_at = NULL, error = '', updated_at = excluded.updated_at",
            (key, seq, kind, text, now, now),
        )
        return True

    def _kick(self, *keys: str) -> None:
        """Run these operations now, unless the controller is known to be down (then
        ``poll()`` retries them on their backoff schedule): a port call returns quickly."""
        if self._down_since is not None:
            return
        self._run_ops(only=keys)

    def _run_ops(self, only: Sequence[str] | None = None) -> None:
        done: set[tuple[str, int]] = set()
        while True:
            now = self._clock.now()
            with self._tx() as db:
                sql = (
                    "SELECT * FROM ops WHERE next_at <= ? AND (status = 'pending'"
                    " OR (status = 'running' AND claimed_at <= ?))"
                )
                params: list[Any] = [now, now - OP_LEASE_S]
                if only is not None:
                    if not only:
                        return
                    sql += f" AND key IN ({','.join('?' * len(only))})"
                    params.extend(only)
                rows = db.execute(sql + " ORDER BY seq", params).fetchall()
                row = next((r for r in rows if (r["key"], r["seq"]) not in done), None)
                if row is None:
                    return
                done.add((row["key"], row["seq"]))
                db.execute(
                    "UPDATE ops SET status = 'running', claimed_at = ? WHERE key = ? AND seq = ?",
                    (now, row["key"], row["seq"]),
                )
            result = self._execute(row["kind"], json.loads(row["args"]))
            with self._tx() as db:
                self._record(db, row, result)
            if result.transient and not result.quiet:
                return  # the controller is not answering: the rest waits for the retry

    def _execute(self, kind: str, args: dict[str, Any]) -> _OpResult:
        try:
            handler = getattr(self, f"_op_{kind}")
            result = handler(args)
            assert isinstance(result, _OpResult)
        except SlurmTransientError as exc:
            self._controller_down(str(exc))
            return _OpResult(False, transient=True, error=str(exc))
        except SlurmError as exc:
            return _OpResult(False, error=str(exc))
        except OSError as exc:  # writing scripts, reading run files
            return _OpResult(False, error=f"{type(exc).__name__}: {exc}")
        if self._down_since is not None and not result.quiet:
            self._controller_up()
        return result

    def _record(self, db: sqlite3.Connection, row: sqlite3.Row, result: _OpResult) -> None:
        now = self._clock.now()
        current = db.execute("SELECT seq FROM ops WHERE key = ?", (row["key"],)).fetchone()
        replaced = current is None or current["seq"] != row["seq"]
        kind, args = row["kind"], json.loads(row["args"])
        if result.ok:
            if not replaced:
                db.execute(
                    "UPDATE ops SET status = 'done', claimed_at = NULL, error = '', updated_at = ?"
                    " WHERE key = ?",
                    (now, row["key"]),
                )
            self._on_done(db, kind, args, result.data, now)
            return
        if result.transient:
            tries = row["tries"] + 1
            delay = (
                self._retry_initial
                if result.quiet
                else min(self._retry_max, self._retry_initial * 2 ** (tries - 1))
            )
            if not replaced:
                db.execute(
                    "UPDATE ops SET status = 'pending', tries = ?, next_at = ?, claimed_at = NULL,"
                    " error = ?, updated_at = ? WHERE key = ?",
                    (tries, now + delay, result.error[:1000], now, row["key"]),
                )
            if not result.quiet and tries in (1, 5, 20):
                self._alert(
                    db,
                    "slurm-unreachable",
                    row["key"],
                    f"{kind} failed ({result.error}); retry {tries} in {delay:g}s, with backoff",
                )
            return
        if not replaced:
            db.execute(
                "UPDATE ops SET status = 'failed', claimed_at = NULL, error = ?, updated_at = ?"
                " WHERE key = ?",
                (result.error[:1000], now, row["key"]),
            )
        self._alert(db, "slurm-command-failed", row["key"], f"{kind}: {result.error}")
        self._on_failed(db, kind, args, result.error, now)

    def _waited(self, since: float, now: float) -> float:
        """How long something has waited for Slurm, not counting the last outage: a reboot
        that could not be checked on while slurmctld was down has not timed out."""
        return now - max(since, self._up_since)

    def _controller_down(self, error: str) -> None:
        if self._down_since is None:
            self._down_since = self._clock.now()
            with contextlib.suppress(sqlite3.Error), self._tx() as db:
                self._alert(db, "slurm-unreachable", "slurmctld", f"{error}; retrying with backoff")

    def _controller_up(self) -> None:
        if self._down_since is not None:
            now = self._clock.now()
            down_for = now - self._down_since
            self._down_since = None
            self._up_since = now
            log.warning("slurmctld answers again after %.1fs: running what waited", down_for)
            with self._tx() as db:  # what backed off during the outage need not wait any more
                db.execute("UPDATE ops SET next_at = ? WHERE status = 'pending' AND next_at > ?", (now, now))

    # -- the operations (each runs outside any transaction)

    def _op_drain(self, args: dict[str, Any]) -> _OpResult:
        self.cli.drain(args["node"], args["reason"])
        return _OpResult(True)

    def _op_resume(self, args: dict[str, Any]) -> _OpResult:
        try:
            self.cli.resume(args["node"])
        except SlurmPermanentError as exc:
            if "invalid node state" not in str(exc).lower():
                raise
            # not drained (any more): already in service, which is what we want
        return _OpResult(True)

    def _op_reboot(self, args: dict[str, Any]) -> _OpResult:
        node, reason = args["node"], args["reason"]
        record = next((r for r in self.cli.node_records() if r.name == node), None)
        if record is None:
            return _OpResult(False, error=f"Invalid node name specified: {node}")
        if not record.node.drained:  # a plain reboot of a drained node keeps it drained
            self.cli.drain(node, reason)
        issued = self._clock.now()
        self.cli.reboot_keep_drain(node, reason)
        return _OpResult(True, data={"boot_before": record.slurmd_start_time, "issued_at": issued})

    def _op_power_up(self, args: dict[str, Any]) -> _OpResult:
        try:
            self.cli.power_up(args["node"])
        except SlurmPermanentError:
            record = next((r for r in self.cli.node_records() if r.name == args["node"]), None)
            if record is None or record.node.powered_down:
                raise
        return _OpResult(True)

    def _op_power_down(self, args: dict[str, Any]) -> _OpResult:
        try:
            self.cli.power_down(args["node"])
        except SlurmPermanentError:
            record = next((r for r in self.cli.node_records() if r.name == args["node"]), None)
            if record is None or not (record.node.powered_down or "POWERING_DOWN" in record.flags):
                raise
        return _OpResult(True)

    def _op_submit(self, args: dict[str, Any]) -> _OpResult:
        job_id, attempt = args["job_id"], args["attempt"]
        name = job_name(job_id, attempt, self.instance)
        existing = [j for j in self.cli.jobs() if j.name == name]
        if existing:  # submitted before, but the answer was lost: adopt it, never run twice
            return _OpResult(True, data={"slurm_job_id": max(j.job_id for j in existing)})
        self._ensure_partition()
        nodes = list(args["slurm_nodes"])
        run_dir = Path(args["run_dir"])
        try:
            slurm_id = self._sbatch(name, nodes, run_dir, args["output"])
        except SlurmPermanentError as exc:
            if not self.partition or "invalid partition" not in str(exc).lower():
                raise
            self._partition_ready = False  # slurmctld restarted without it (cluster.sh: -c)
            self._ensure_partition()
            slurm_id = self._sbatch(name, nodes, run_dir, args["output"])
        log.info("submitted %s as Slurm job %d on %s", name, slurm_id, ",".join(nodes))
        return _OpResult(True, data={"slurm_job_id": slurm_id})

    def _ensure_partition(self) -> None:
        if self.partition and not self._partition_ready:
            members = ",".join(self._allowed) if self._allowed else "ALL"
            self.cli.ensure_partition(self.partition, members)
            self._partition_ready = True

    def _sbatch(self, name: str, nodes: Sequence[str], run_dir: Path, output: str) -> int:
        return self.cli.submit(
            str(run_dir / "batch.sh"),
            nodes=len(nodes),
            job_name=name,
            requeue=True,
            open_mode="append",
            output=output,
            partition=self.partition,
            extra_args=(
                f"--nodelist={','.join(nodes)}",
                f"--ntasks={len(nodes)}",
                "--ntasks-per-node=1",
                "--exclusive",
                f"--chdir={run_dir}",
            ),
        )

    def _op_signal(self, args: dict[str, Any]) -> _OpResult:
        slurm_id = self.slurm_job_id(args["job_id"], args["attempt"])
        if slurm_id is None:
            return self._before_submit(args)
        try:
            self.cli.signal_job(slurm_id, "TERM")
        except SlurmPermanentError:
            job = next((j for j in self.cli.jobs() if j.job_id == slurm_id), None)
            if job is None or job.job_state in TERMINAL_JOB_STATES:
                return _OpResult(True)  # already over: nothing left to tell
            if job.job_state == "PENDING":  # nothing runs yet, so nothing to checkpoint
                self.cli.cancel(slurm_id)
                return _OpResult(True)
            raise
        return _OpResult(True)

    def _op_cancel(self, args: dict[str, Any]) -> _OpResult:
        slurm_id = self.slurm_job_id(args["job_id"], args["attempt"])
        if slurm_id is None:
            return self._before_submit(args)
        try:
            self.cli.cancel(slurm_id)
        except SlurmPermanentError:
            job = next((j for j in self.cli.jobs() if j.job_id == slurm_id), None)
            if job is not None and job.job_state not in TERMINAL_JOB_STATES:
                raise
        return _OpResult(True)

    def _before_submit(self, args: dict[str, Any]) -> _OpResult:
        """Signal or cancel of an attempt whose sbatch has not gone through yet: wait for it,
        unless it failed (then the attempt is already over)."""
        with self._tx() as db:
            att = self._attempt(db, args["job_id"], args["attempt"])
        if att is None or att["finalized"]:
            return _OpResult(True)
        return _OpResult(False, transient=True, quiet=True, error="waiting for sbatch")

    # -- results

    def _on_done(
        self, db: sqlite3.Connection, kind: str, args: dict[str, Any], data: dict[str, Any], now: float
    ) -> None:
        if kind == "reboot":
            db.execute(
                "UPDATE repairs SET boot_before = ?, issued_at = ? WHERE node_id = ? AND attempt = ?",
                (data["boot_before"], data["issued_at"], args["node_id"], args["attempt"]),
            )
        elif kind == "submit":
            db.execute(
                "UPDATE attempts SET slurm_job_id = ? WHERE job_id = ? AND attempt = ?",
                (data["slurm_job_id"], args["job_id"], args["attempt"]),
            )

    def _on_failed(
        self, db: sqlite3.Connection, kind: str, args: dict[str, Any], error: str, now: float
    ) -> None:
        if kind == "reboot":
            rep = db.execute(
                "SELECT * FROM repairs WHERE node_id = ? AND attempt = ?",
                (args["node_id"], args["attempt"]),
            ).fetchone()
            if rep is not None and rep["completed_at"] is None:
                self._complete_repair(db, rep, now, False, f"scontrol reboot failed: {error}")
        elif kind == "submit":
            att = self._attempt(db, args["job_id"], args["attempt"])
            if att is not None and not att["finalized"]:
                self._finalize(db, att, EXIT_SUBMIT_FAILED, f"sbatch failed: {error}")
        elif kind == "power_up" and args.get("node_id"):
            row = self._node(db, args["node_id"])
            if row is not None and row["provisioned"] == 0:
                db.execute("UPDATE nodes SET provisioned = -1 WHERE node_id = ?", (row["node_id"],))
                self._queue(
                    db, NodeProvisioned(row["node_id"], False, f"power up of {args['node']}: {error}")
                )

    # ------------------------------------------------------------ nodes

    def provision_node(self, node: Node) -> None:
        """Record the node; ``poll()`` assigns it a Slurm node and reports it up."""
        now = self._clock.now()
        with self._tx() as db:
            if self._node(db, node.node_id) is not None:
                return
            role = NodeRole(node.role).value
            db.execute(
                "INSERT INTO nodes (node_id, role, machine_type, wants_cloud, requested_at,"
                " provisioned) VALUES (?, ?, ?, ?, ?, 0)",
                (node.node_id, role, node.machine_type, int(bool(node.replaces)), now),
            )
            if role == NodeRole.LOGIN.value:  # no Slurm node: it is the controller's host
                db.execute("UPDATE nodes SET provisioned = 1 WHERE node_id = ?", (node.node_id,))
                self._queue(db, NodeProvisioned(node.node_id, True, "login node: the slurmctld host"))

    def cordon(self, node_id: str, reason: str) -> None:
        """Drain the node in Slurm with ``reason``: running jobs go on, no new ones start."""
        text = _reason(reason)
        with self._tx() as db:
            row = self._node(db, node_id)
            if row is None or row["deleted"]:
                return
            db.execute(
                "UPDATE nodes SET cordon = 'fault', cordon_reason = ? WHERE node_id = ?", (text, node_id)
            )
            key = self._want_state(db, row["slurm_node"], "drain", text)
        if key:
            self._kick(key)

    def uncordon(self, node_id: str) -> None:
        """The node passed its checks: ``scontrol update state=resume``."""
        with self._tx() as db:
            row = self._node(db, node_id)
            if row is None or row["deleted"]:
                return
            db.execute("UPDATE nodes SET cordon = NULL, cordon_reason = '' WHERE node_id = ?", (node_id,))
            key = self._want_state(db, row["slurm_node"], "resume", "")
        if key:
            self._kick(key)

    def _want_state(self, db: sqlite3.Connection, slurm_node: str | None, want: str, reason: str) -> str:
        if not slurm_node:
            return ""  # applied when a Slurm node is assigned
        key = f"state:{slurm_node}"
        args = {"node": slurm_node, "reason": reason} if want == "drain" else {"node": slurm_node}
        self._put_op(db, key, want, args, replace=True)
        return key

    def delete_node(self, node_id: str) -> None:
        """Release the node. One mtc took out for a fault leaves the fleet (powered down), so
        does a cloud node mtc powered up; a healthy static node goes back to the free pool."""
        keys: list[str] = []
        with self._tx() as db:
            row = self._node(db, node_id)
            if row is None or row["deleted"]:
                return
            db.execute("UPDATE nodes SET deleted = 1 WHERE node_id = ?", (node_id,))
            slurm_node = row["slurm_node"]
            if row["role"] != NodeRole.WORKER.value or not slurm_node:
                return
            if row["cloud"] or row["cordon"] == "fault":
                state_key = f"state:{slurm_node}"
                if row["cordon"] == "fault":
                    reason = _reason(f"retired: {row['cordon_reason'].removeprefix('mtc: ')}")
                    self._put_op(db, state_key, "drain", {"node": slurm_node, "reason": reason}, replace=True)
                    keys.append(state_key)
                key = f"power_down:{slurm_node}:{node_id}"
                self._put_op(db, key, "power_down", {"node": slurm_node})
                keys.append(key)
            elif row["cordon"] is not None:
                keys.append(self._want_state(db, slurm_node, "resume", ""))
        self._kick(*keys)

    # ------------------------------------------------------------ repairs

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        """Once per (node, attempt); a repeat, even with another action, is a no-op.
        RESET_GPU/REBOOT/REIMAGE reboot the Slurm node; REPLACE swaps in a cloud node;
        MANUAL never completes by itself."""
        action = RA(action)
        now = self._clock.now()
        keys: list[str] = []
        with self._tx() as db:
            row = self._node(db, node_id)
            slurm_node = row["slurm_node"] if row is not None else None
            inserted = db.execute(
                "INSERT OR IGNORE INTO repairs (node_id, attempt, action, slurm_node, started_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (node_id, attempt, action.value, slurm_node, now),
            ).rowcount
            if not inserted or row is None or row["deleted"] or not slurm_node:
                return
            if action in REBOOTS:
                key = f"repair:{node_id}:{attempt}"
                why = row["cordon_reason"].removeprefix("mtc: ") or "requested by mtc"
                reason = _reason(f"{action.value} (repair {attempt}): {why}")
                self._put_op(
                    db,
                    key,
                    "reboot",
                    {"node": slurm_node, "reason": reason, "node_id": node_id, "attempt": attempt},
                )
                keys.append(key)
            elif action is RA.REPLACE:
                down = f"power_down:{slurm_node}:{node_id}"
                self._put_op(db, down, "power_down", {"node": slurm_node})
                keys.append(down)
                db.execute(
                    "UPDATE nodes SET slurm_node = NULL, cloud = 0, wants_cloud = 1 WHERE node_id = ?",
                    (node_id,),
                )
                self._agents.pop(slurm_node, None)
        self._kick(*keys)

    def _complete_repair(
        self, db: sqlite3.Connection, rep: sqlite3.Row, now: float, ok: bool, detail: str
    ) -> None:
        db.execute(
            "UPDATE repairs SET completed_at = ? WHERE node_id = ? AND attempt = ?",
            (now, rep["node_id"], rep["attempt"]),
        )
        node_id = rep["node_id"]
        self._queue(db, NodeRepairCompleted(node_id, rep["action"], rep["attempt"], ok, detail))
        row = self._node(db, node_id)
        if not ok or row is None or not row["slurm_node"]:
            return
        report = self._collect(row, now)
        self._queue(db, NodeHealthReported(node_id, now, _conditions(report), source="post-repair-check"))
        self._agents[row["slurm_node"]].acknowledge()
        db.execute(
            "UPDATE nodes SET next_report_at = ? WHERE node_id = ?", (now + self._agent_interval, node_id)
        )

    def _observe_repairs(self, db: sqlite3.Connection, now: float) -> None:
        for rep in db.execute(
            "SELECT * FROM repairs WHERE completed_at IS NULL ORDER BY started_at"
        ).fetchall():
            action = RA(rep["action"])
            row = self._node(db, rep["node_id"])
            if row is None or row["deleted"]:
                db.execute(
                    "UPDATE repairs SET completed_at = ? WHERE node_id = ? AND attempt = ?",
                    (now, rep["node_id"], rep["attempt"]),
                )
                if row is None:
                    self._queue(
                        db,
                        NodeRepairCompleted(
                            rep["node_id"], action.value, rep["attempt"], False, "unknown node"
                        ),
                    )
                continue
            if action is RA.MANUAL:
                continue
            if action in (RA.NONE, RA.RESTART_JOB):
                self._complete_repair(db, rep, now, True, "nothing to do on the node")
                continue
            if not row["slurm_node"] and action is not RA.REPLACE:
                self._complete_repair(db, rep, now, False, "node has no Slurm node")
                continue
            if action in REBOOTS:
                self._observe_reboot(db, rep, row, action, now)
            elif action is RA.REPLACE:
                self._observe_replace(db, rep, row, now)

    def _observe_reboot(
        self, db: sqlite3.Connection, rep: sqlite3.Row, row: sqlite3.Row, action: RepairAction, now: float
    ) -> None:
        slurm_node = rep["slurm_node"]
        if rep["issued_at"] is None:  # the reboot command has not gone through yet
            if self._waited(rep["started_at"], now) > self._repair_timeout:
                self._complete_repair(db, rep, now, False, f"reboot of {slurm_node} never issued")
            return
        record = self._view.get(slurm_node)
        back = (
            record is not None
            and record.slurmd_start_time != rep["boot_before"]
            and record.up
            and not record.rebooting
        )
        if back:
            assert record is not None
            self._new_boot(slurm_node, wipe_scratch=action is RA.REIMAGE)
            what = "rebooted" if action is not RA.REIMAGE else "rebooted, scratch wiped (reimage)"
            detail = f"Slurm node {slurm_node} {what}; slurmd started at {record.slurmd_start_time}"
            self._complete_repair(db, rep, now, True, detail)
        elif self._waited(rep["issued_at"], now) > self._repair_timeout:
            self._complete_repair(
                db, rep, now, False, f"{slurm_node} not back {self._repair_timeout:g}s after reboot"
            )

    def _observe_replace(
        self, db: sqlite3.Connection, rep: sqlite3.Row, row: sqlite3.Row, now: float
    ) -> None:
        new = row["slurm_node"]
        record = self._view.get(new) if new else None
        if new and new != rep["slurm_node"] and record is not None and record.up:
            detail = f"Slurm node {rep['slurm_node']} powered down, replaced by {new}"
            self._complete_repair(db, rep, now, True, detail)
        elif self._waited(rep["started_at"], now) > self._repair_timeout:
            self._complete_repair(db, rep, now, False, f"no replacement up after {self._repair_timeout:g}s")

    def _new_boot(self, slurm_node: str, *, wipe_scratch: bool = False) -> None:
        """A (re)booted node: a fresh kernel log (the old one rotated), a fresh agent; a
        reimage also wipes the node's scratch directory."""
        path = self.kernel_log(slurm_node)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size:
            os.replace(path, path.with_name(f"kern.log.{time.strftime('%Y%m%dT%H%M%S')}"))
        path.touch()
        scratch = self.scratch_dir(slurm_node)
        if wipe_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True, exist_ok=True)
        self._agents[slurm_node] = AgentState()

    # ------------------------------------------------------------ provisioning

    def _assign_pending(self, db: sqlite3.Connection, now: float) -> list[str]:
        """Give each worker node waiting for one a Slurm node; returns operation keys."""
        waiting = db.execute(
            "SELECT * FROM nodes WHERE role = 'worker' AND deleted = 0 AND slurm_node IS NULL"
            " AND provisioned >= 0 ORDER BY requested_at, node_id"
        ).fetchall()
        if not waiting:
            return []
        taken = {
            r["slurm_node"]
            for r in db.execute("SELECT slurm_node FROM nodes WHERE deleted = 0 AND slurm_node IS NOT NULL")
        }
        leaving = {
            json.loads(r["args"])["node"]
            for r in db.execute(
                "SELECT args FROM ops WHERE kind = 'power_down' AND status IN ('pending', 'running')"
            )
        }
        keys: list[str] = []
        for row in waiting:
            free = [
                r
                for name, r in sorted(self._view.items())
                if name not in taken
                and name not in leaving
                and (self._allowed is None or name in self._allowed)
            ]
            static = [
                r for r in free if not r.cloud and r.up and r.node.state == "idle" and not r.node.drained
            ]
            cloud = [r for r in free if r.cloud and r.node.powered_down and "POWERING_DOWN" not in r.flags]
            choice = (cloud + static) if row["wants_cloud"] else (static + cloud)
            if not choice:
                if not row["alerted"]:
                    db.execute("UPDATE nodes SET alerted = 1 WHERE node_id = ?", (row["node_id"],))
                    self._alert(db, "no-capacity", row["node_id"], "no free Slurm node (static or cloud)")
                continue
            record = choice[0]
            taken.add(record.name)
            keys.extend(self._assign(db, row, record, now))
        return keys

    def _assign(self, db: sqlite3.Connection, row: sqlite3.Row, record: NodeRecord, now: float) -> list[str]:
        node_id, slurm_node = row["node_id"], record.name
        db.execute(
            "UPDATE nodes SET slurm_node = ?, cloud = ?, assigned_at = ? WHERE node_id = ?",
            (slurm_node, int(record.cloud), now, node_id),
        )
        self._new_boot(slurm_node, wipe_scratch=True)  # a machine new to this node id
        keys = []
        if record.cloud:
            key = f"power_up:{slurm_node}:{node_id}"
            self._put_op(db, key, "power_up", {"node": slurm_node, "node_id": node_id})
            keys.append(key)
        if row["cordon"] == "fault":
            reason = row["cordon_reason"]
        else:
            reason = _reason(f"{node_id} provisioned, running its first checks")
            db.execute(
                "UPDATE nodes SET cordon = 'verify', cordon_reason = ? WHERE node_id = ?", (reason, node_id)
            )
        keys.append(self._want_state(db, slurm_node, "drain", reason))
        log.info("mtc node %s -> Slurm node %s%s", node_id, slurm_node, " (cloud)" if record.cloud else "")
        return keys

    def _observe_provisioning(self, db: sqlite3.Connection, now: float) -> None:
        for row in db.execute(
            "SELECT * FROM nodes WHERE role = 'worker' AND deleted = 0 AND provisioned = 0"
            " ORDER BY requested_at, node_id"
        ).fetchall():
            node_id, slurm_node = row["node_id"], row["slurm_node"]
            record = self._view.get(slurm_node) if slurm_node else None
            if record is not None and record.up and not record.rebooting:
                db.execute(
                    "UPDATE nodes SET provisioned = 1, next_report_at = ? WHERE node_id = ?", (now, node_id)
                )
                kind = "cloud node, powered up" if row["cloud"] else "static node"
                self._queue(db, NodeProvisioned(node_id, True, f"Slurm node {slurm_node} ({kind})"))
            elif self._waited(row["requested_at"], now) > self._provision_timeout:
                db.execute("UPDATE nodes SET provisioned = -1 WHERE node_id = ?", (node_id,))
                what = f"Slurm node {slurm_node} not up" if slurm_node else "no free Slurm node"
                self._queue(db, NodeProvisioned(node_id, False, f"{what} after {self._provision_timeout:g}s"))

    # ------------------------------------------------------------ the node agents

    def _agent_config(self, row: sqlite3.Row, slurm_node: str) -> AgentConfig:
        node_dir = self.node_dir(slurm_node)
        return AgentConfig(
            node_id=row["node_id"],
            node_type=row["machine_type"],
            probes=self._probes,
            xid_source=str(self.kernel_log(slurm_node)),
            xid_cursor_path=str(node_dir / "xid.cursor"),
            mounts=(str(self.scratch_dir(slurm_node)),),
            command_timeout_s=self._agent_timeout,
            dcgm_timeout_s=max(self._agent_timeout, 30.0),
        )

    def _collect(self, row: sqlite3.Row, now: float) -> HealthReport:
        """One run of the node agent's probes for this node (its XID cursor moves on only
        when the caller ``acknowledge()``s the delivered report)."""
        slurm_node = row["slurm_node"]
        state = self._agents.setdefault(slurm_node, AgentState())
        log_path = self.kernel_log(slurm_node)
        if not log_path.exists():
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.touch()
        self.scratch_dir(slurm_node).mkdir(parents=True, exist_ok=True)
        return collect(self._agent_config(row, slurm_node), now, runner=self._agent_runner, state=state)

    def _agent_tick(self, now: float) -> None:
        """Each node's agent reports every ``agent_interval_s`` while its slurmd is up."""
        with self._tx() as db:
            due = db.execute(
                "SELECT * FROM nodes WHERE role = 'worker' AND deleted = 0 AND provisioned = 1"
                " AND slurm_node IS NOT NULL AND COALESCE(next_report_at, 0) <= ?"
                " AND node_id NOT IN (SELECT node_id FROM repairs WHERE completed_at IS NULL)"
                " ORDER BY node_id",
                (now,),
            ).fetchall()
            for row in due:
                db.execute(
                    "UPDATE nodes SET next_report_at = ? WHERE node_id = ?",
                    (now + self._agent_interval, row["node_id"]),
                )
        for row in due:
            record = self._view.get(row["slurm_node"])
            if record is not None and not record.up:
                continue  # the node is down: its agent cannot report (the heartbeat lapses)
            report = self._collect(row, now)
            self._emit(NodeHealthReported(row["node_id"], now, _conditions(report), source="agent"))
            self._agents[row["slurm_node"]].acknowledge()  # delivered: move the XID cursor on

    # ------------------------------------------------------------ workers

    def start_workers(self, workers: Sequence[WorkerSpec]) -> None:
        """One ``sbatch`` per (job, attempt), one srun task per node; a repeat is a no-op."""
        groups: dict[tuple[str, int], list[WorkerSpec]] = {}
        for spec in workers:
            groups.setdefault((spec.job_id, spec.attempt), []).append(spec)
        keys: list[str] = []
        now = self._clock.now()
        for (job_id, attempt), specs in sorted(groups.items()):
            specs.sort(key=lambda s: s.rank)
            with self._tx() as db:
                if self._attempt(db, job_id, attempt) is not None:
                    continue
                names = {s.node_id: self._slurm_name(db, s.node_id) for s in specs}
                run_dir = self.run_dir(job_id, attempt)
                output = self.job_log(job_id)
                slurm_nodes = [names[s.node_id] or "" for s in specs]
                db.execute(
                    "INSERT INTO attempts (job_id, attempt, world_size, slurm_nodes, checkpoint_dir,"
                    " run_dir, output, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        job_id,
                        attempt,
                        specs[0].world_size,
                        json.dumps(slurm_nodes),
                        str(Path(specs[0].checkpoint_dir).absolute()),
                        str(run_dir),
                        str(output),
                        now,
                    ),
                )
                missing = [s.node_id for s in specs if not names[s.node_id]]
                if missing or len(specs) != specs[0].world_size:
                    att = self._attempt(db, job_id, attempt)
                    assert att is not None
                    why = f"no Slurm node for {missing}" if missing else "not one spec per rank"
                    self._finalize(db, att, EXIT_SUBMIT_FAILED, f"cannot submit: {why}")
                    continue
                self._write_scripts(specs, names, run_dir, output)
                key = f"submit:{job_id}:{attempt}"
                self._put_op(
                    db,
                    key,
                    "submit",
                    {
                        "job_id": job_id,
                        "attempt": attempt,
                        "slurm_nodes": slurm_nodes,
                        "run_dir": str(run_dir),
                        "output": str(output),
                    },
                )
                keys.append(key)
        self._kick(*keys)

    def _slurm_name(self, db: sqlite3.Connection, node_id: str) -> str | None:
        row = self._node(db, node_id)
        return None if row is None or row["deleted"] else cast("str | None", row["slurm_node"])

    def managed_env(self, spec: WorkerSpec) -> dict[str, str]:
        """What a managed service adds to a replica's environment: ``LocalCompute``'s
        ``worker_env`` less what the process environment already holds."""
        return managed_env(spec, self._master_addr)

    def _write_scripts(
        self, specs: Sequence[WorkerSpec], names: Mapping[str, str | None], run_dir: Path, output: Path
    ) -> None:
        first = specs[0]
        for d in (first.checkpoint_dir, first.model_dir, first.tensorboard_dir):
            Path(d).mkdir(parents=True, exist_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        output.parent.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.glob("*.exit"):
            stale.unlink()
        env = self.managed_env(first)
        spec_doc = json.loads(env.pop("CLUSTER_SPEC"))
        spec_doc["task"]["index"] = "__MTC_RANK__"
        spec_doc["task"]["node_id"] = "__MTC_NODE__"
        template = json.dumps(spec_doc).replace('"__MTC_RANK__"', "__MTC_RANK__")
        for var in ("RANK", "MTC_NODE_ID"):
            env.pop(var, None)
        q = shlex.quote
        lines = [
            "#!/bin/bash",
            f"# mtc job {first.job_id} attempt {first.attempt}: one rank per node, started by srun",
            "# (written by shared/adapters/compute/slurm_compute.py; RANK is Slurm's task id)",
            'export RANK="${SLURM_PROCID:?task.sh runs under srun}"',
            'case "${SLURMD_NODENAME:-}" in',
        ]
        lines += [f"    {q(names[s.node_id] or '')}) MTC_NODE_ID={q(s.node_id)} ;;" for s in specs]
        lines += [
            '    *) MTC_NODE_ID="${SLURMD_NODENAME:-unknown}" ;;',
            "esac",
            "export MTC_NODE_ID",
            'export MTC_SLURM_NODE="${SLURMD_NODENAME:-}"',
        ]
        lines += [f"export {k}={q(v)}" for k, v in sorted(env.items())]
        lines += [
            f"spec={q(template)}",
            'spec="${spec//__MTC_RANK__/$RANK}"',
            'export CLUSTER_SPEC="${spec//__MTC_NODE__/$MTC_NODE_ID}"',
            f'exec {q(self._python)} {q(str(LAUNCHER))} --exit-file {q(str(run_dir))}/rank-"$RANK".exit'
            f" -- {shlex.join(first.command)}",
        ]
        _write_executable(run_dir / "task.sh", "\n".join(lines) + "\n")
        k = len(specs)
        tag = f"[mtc] job {first.job_id} attempt {first.attempt}"
        batch = [
            "#!/bin/bash",
            f"# mtc job {first.job_id} attempt {first.attempt}: one srun step, one task per node",
            "# (written by shared/adapters/compute/slurm_compute.py)",
            'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
            f'    echo "{tag}: requeued by Slurm itself; mtc runs a new attempt instead"',
            "    exit 0",
            "fi",
            f'echo "{tag}: Slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
            f"srun --nodes={k} --ntasks={k} --ntasks-per-node=1 --kill-on-bad-exit=0 "
            f"{q(str(run_dir / 'task.sh'))}",
            "rc=$?",
            f'echo "$rc" > {q(str(run_dir))}/.batch.exit.tmp && mv -f {q(str(run_dir))}/.batch.exit.tmp'
            f" {q(str(run_dir))}/batch.exit",
            f'echo "{tag}: srun exited $rc"',
            'exit "$rc"',
        ]
        _write_executable(run_dir / "batch.sh", "\n".join(batch) + "\n")

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        """``scancel --signal=TERM`` now, ``scancel`` after ``grace_s`` (from ``poll()``). A
        repeat does not signal again; it can only bring the deadline closer."""
        now = self._clock.now()
        key = f"signal:{job_id}:{attempt}"
        with self._tx() as db:
            att = self._attempt(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            deadline = now + max(0.0, grace_s)
            if att["signalled_at"] is None:
                db.execute(
                    "UPDATE attempts SET signalled_at = ?, kill_deadline = ?"
                    " WHERE job_id = ? AND attempt = ?",
                    (now, deadline, job_id, attempt),
                )
                self._put_op(db, key, "signal", {"job_id": job_id, "attempt": attempt})
            elif att["kill_deadline"] is None or deadline < att["kill_deadline"]:
                db.execute(
                    "UPDATE attempts SET kill_deadline = ? WHERE job_id = ? AND attempt = ?",
                    (deadline, job_id, attempt),
                )
        self._kick(key)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        """``scancel`` the attempt's job now; harmless if it is gone."""
        with self._tx() as db:
            att = self._attempt(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            key = self._cancel(db, att)
        self._kick(key)

    def _cancel(self, db: sqlite3.Connection, att: sqlite3.Row) -> str:
        db.execute(
            "UPDATE attempts SET cancel_sent = 1 WHERE job_id = ? AND attempt = ?",
            (att["job_id"], att["attempt"]),
        )
        key = f"cancel:{att['job_id']}:{att['attempt']}"
        self._put_op(db, key, "cancel", {"job_id": att["job_id"], "attempt": att["attempt"]})
        return key

    def kill_all(self, wait_s: float = 15.0) -> None:
        """Cancel every Slurm job of an unfinished attempt (tests, demo shutdown) and wait up
        to ``wait_s`` for them to leave the nodes, so the next ``poll()`` reports them."""
        with self._tx() as db:
            atts = db.execute("SELECT * FROM attempts WHERE finalized = 0").fetchall()
            db.execute(
                "UPDATE ops SET status = 'done', error = 'kill_all' WHERE kind = 'submit'"
                " AND status IN ('pending', 'running')"
            )
        ids = [a["slurm_job_id"] for a in atts if a["slurm_job_id"] is not None]
        for slurm_id in ids:
            with contextlib.suppress(SlurmError):
                self.cli.cancel(slurm_id)
        deadline = time.monotonic() + wait_s
        while ids and time.monotonic() < deadline:
            try:
                live = {j.job_id for j in self.cli.jobs() if j.job_state not in TERMINAL_JOB_STATES}
            except SlurmError:
                live = set(ids)
            if not live & set(ids):
                return
            time.sleep(0.2)

    @staticmethod
    def _attempt(db: sqlite3.Connection, job_id: str, attempt: int) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute(
            "SELECT * FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
        ).fetchone()
        return row

    @staticmethod
    def _node(db: sqlite3.Connection, node_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return row

    def _finalize(self, db: sqlite3.Connection, att: sqlite3.Row, code: int, detail: str) -> None:
        db.execute(
            "UPDATE attempts SET finalized = 1 WHERE job_id = ? AND attempt = ?",
            (att["job_id"], att["attempt"]),
        )
        self._queue(db, JobWorkersExited(att["job_id"], att["attempt"], code, detail))

    def _observe_attempts(self, db: sqlite3.Connection, now: float, fresh: bool) -> list[str]:
        keys: list[str] = []
        for att in db.execute("SELECT * FROM attempts WHERE finalized = 0").fetchall():
            self._scan_checkpoints(db, att, now)
            if att["kill_deadline"] is not None and att["kill_deadline"] <= now and not att["cancel_sent"]:
                keys.append(self._cancel(db, att))
            run_dir = Path(att["run_dir"])
            codes = {r: read_exit_file(run_dir / f"rank-{r}.exit") for r in range(att["world_size"])}
            slurm_id = att["slurm_job_id"]
            where = f" (Slurm job {slurm_id})" if slurm_id is not None else ""
            if all(c is not None for c in codes.values()):
                self._finalize_codes(db, att, codes, where)
                continue
            if not fresh or slurm_id is None:
                continue  # nothing can be inferred from a controller that does not answer
            job = self._jobs.get(slurm_id)
            requeued = job is not None and (job.restart_cnt > 0 or job.job_state in REQUEUED_JOB_STATES)
            over = job is None or job.job_state in TERMINAL_JOB_STATES or requeued
            if not over:
                if att["gone_since"] is not None:
                    db.execute(
                        "UPDATE attempts SET gone_since = NULL WHERE job_id = ? AND attempt = ?",
                        (att["job_id"], att["attempt"]),
                    )
                continue
            if att["gone_since"] is None:
                db.execute(
                    "UPDATE attempts SET gone_since = ? WHERE job_id = ? AND attempt = ?",
                    (now, att["job_id"], att["attempt"]),
                )
                continue
            if now - att["gone_since"] < JOB_GONE_SETTLE_S:
                continue
            self._scan_checkpoints(db, att, now)
            codes = {r: read_exit_file(run_dir / f"rank-{r}.exit") for r in range(att["world_size"])}
            state = "gone from squeue" if job is None else job.job_state
            if requeued:
                state = "requeued by Slurm itself"
                if not att["cancel_sent"]:
                    keys.append(self._cancel(db, att))
            self._finalize_codes(db, att, codes, f"{where}, {state}; no exit file: killed")
        return keys

    def _finalize_codes(
        self, db: sqlite3.Connection, att: sqlite3.Row, codes: Mapping[int, int | None], note: str
    ) -> None:
        final = {r: EXIT_KILLED if c is None else c for r, c in sorted(codes.items())}
        worst = next((c for c in final.values() if c != 0), 0)
        detail = ", ".join(f"rank {r}: {c}" for r, c in final.items())
        self._finalize(db, att, worst, f"exit codes {detail}{note}")

    def _scan_checkpoints(self, db: sqlite3.Connection, att: sqlite3.Row, now: float) -> None:
        directory = att["checkpoint_dir"]
        seen = {
            r["step"]
            for r in db.execute("SELECT step FROM checkpoints WHERE checkpoint_dir = ?", (directory,))
        }
        for step, path in sorted(checkpoint_steps(Path(directory)).items()):
            if step in seen:
                continue
            db.execute(
                "INSERT INTO checkpoints (checkpoint_dir, step, job_id, attempt, path, seen_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (directory, step, att["job_id"], att["attempt"], str(path), now),
            )
            self._queue(db, JobCheckpointSaved(att["job_id"], att["attempt"], step, str(path), now))

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
            keys += self._observe_attempts(db, now, fresh)
        if keys or self._down_since is None:
            self._run_ops()  # what this poll asked for, and retries whose backoff ran out
        self._drain()
        self._agent_tick(now)


def _conditions(report: HealthReport) -> tuple[dict[str, Any], ...]:
    return tuple(c.to_dict() for c in report.conditions)


def _reason(text: str) -> str:
    """A Slurm drain reason: one line, prefixed so people see who drained the node."""
    flat = " ".join(text.split())
    return (flat if flat.startswith("mtc") else f"mtc: {flat}")[:200]


def _write_executable(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)
