"""Compute for the embedded default: simulated nodes, real worker processes.

Nodes are records on this machine: provisioning and repairs complete after set durations,
faults are injected by hand (``mtc node fault``) and stay until a repair that can fix them.
Job workers are real subprocesses, started in their own session through
``worker_launcher`` so they outlive the CLI process that started them; their exit is read
back later from exit files.

All state lives in a sqlite file under ``state_dir`` (never only in memory), because several
short-lived CLI processes take turns driving the same workers and repairs. Results come back
as events from ``poll()``: each fact (a worker attempt exited, a checkpoint appeared, a repair
finished, a heartbeat slot) is marked in sqlite in the same ``BEGIN IMMEDIATE`` transaction
that queues its event in a small outbox; the outbox is emitted after commit (so an ``emit``
that calls back into this object does not deadlock) and a row is deleted once ``emit``
returns. A fact is therefore emitted once however many processes poll in turn; an ``emit``
that raises leaves its event for the next poll.

Conventions a training program follows so the control plane sees its progress (see
``examples/train.py``):

* **Checkpoints** are found in the file system: an entry of ``AIP_CHECKPOINT_DIR`` named
  ``ckpt-<step>`` with an optional extension (``ckpt-00000100.npz``, ``ckpt-100.pt``, a
  ``ckpt-100`` directory) is a complete checkpoint of that step. It must appear atomically
  (write a temp file, fsync, rename), so names starting with ``.`` and extensions ``.tmp``,
  ``.part``, ``.partial`` are ignored; an ``.npz`` must also be a readable zip. A ``LATEST``
  marker may be written for tools; the scan does not need it. Each step is reported once per
  checkpoint directory (attempts of one job share it), before the attempt's exit.
* **Exit codes**: 0 done; 75 (EX_TEMPFAIL) preempted with a checkpoint saved; 128+N killed by
  signal N; 137 also when a worker vanished without an exit file; 127/126 command not
  found/not executable. ``JobWorkersExited.exit_code`` is the first non-zero code by rank.
* **Signals**: ``signal_workers`` sends SIGTERM to each rank's launcher, which relays it once to
  the rank's whole process group; after ``grace_s`` a ``poll()`` SIGKILLs the groups left.

Which repair clears which fault (``required_action``): the ladder is RESET_GPU < REBOOT <
REIMAGE < REPLACE and an action clears every fault at or below its rung. XIDs of the reset
class, uncorrectable ECC and pending row remaps need RESET_GPU; XIDs 79 and 151 (and 154 with
``recovery_action: node_reboot``), DCGM level 1 (or no level), thermal, slow-node (ratio >=
0.5), lost-heartbeat faults and any ``unknown`` condition need REBOOT; DCGM level 2 and disk
pressure need REIMAGE; failed row remaps, DCGM levels 3-4, severely slow nodes (ratio < 0.5)
and the catalog's manual XIDs (54, 78, 159) need REPLACE. Application-class and benign XIDs
and condition types the table does not know are reported once and not kept: the job
restarts, the node has nothing to repair. ``details["clears_with"]`` (a RepairAction value)
overrides the table, for demos and tests. MANUAL never completes: a person must act. A repair
that cannot fix a fault still completes (ok=True) and its post-repair check still shows the
fault, which is what makes the control plane climb the ladder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import sys
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.adapters.compute.fact_state import FactState
from shared.domain.events import (
    Event,
    JobCheckpointSaved,
    JobWorkersExited,
    NodeHealthReported,
    NodeProvisioned,
    NodeRepairCompleted,
)
from shared.domain.health import Condition, ConditionStatus, ConditionType, RepairAction
from shared.domain.model import Node
from shared.ports import Clock, WorkerSpec

LAUNCHER = Path(__file__).with_name("worker_launcher.py")
EXIT_KILLED = 137  # a worker that vanished without an exit file was killed (128 + SIGKILL)
HEALTHY_REASON = "simulated local node: no fault injected"
MASTER_PORT_BASE, MASTER_PORT_SPAN = 20000, 40000

RA = RepairAction
DEFAULT_REPAIR_DURATIONS_S: Mapping[RepairAction, float] = {
    RA.NONE: 0.0,
    RA.RESTART_JOB: 0.0,
    RA.RESET_GPU: 0.5,
    RA.REBOOT: 1.0,
    RA.REIMAGE: 2.0,
    RA.REPLACE: 2.0,
}
# How far up the ladder an action reaches; MANUAL is absent: it never completes.
RUNG: Mapping[RepairAction, int] = {
    RA.NONE: 0,
    RA.RESTART_JOB: 0,
    RA.RESET_GPU: 1,
    RA.REBOOT: 2,
    RA.REIMAGE: 3,
    RA.REPLACE: 4,
}
REBOOT_XIDS = frozenset({79, 151})
REPLACE_XIDS = frozenset({54, 78, 159})  # the catalog's "a person must act": new hardware here
RESET_XIDS = frozenset(
    {46, 48, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, 154, 155, 156, 158}
    | set(range(144, 151))
)
CHECKPOINT_RE = re.compile(r"^ckpt-(\d+)(\.[A-Za-z0-9_]+)?$")
IGNORED_SUFFIXES = frozenset({".tmp", ".part", ".partial"})

CT = ConditionType


# ---------------------------------------------------------------- fault table


def required_action(condition: Condition) -> RepairAction:
    """The cheapest repair that clears this fault; NONE: transient, nothing to keep."""
    override = condition.details.get("clears_with")
    if override is not None:
        try:
            return RepairAction(str(override))
        except ValueError:
            allowed = ", ".join(a.value for a in RepairAction)
            raise ValueError(
                f"details.clears_with must be one of {allowed}, got {override!r}"
            ) from None
    if condition.status is ConditionStatus.UNKNOWN:
        return RA.REBOOT  # the check could not run: restarting the node brings the agent back
    d = condition.details
    match condition.type:
        case CT.XID_ERROR:
            return _xid_action(d)
        case CT.ECC_UNCORRECTABLE:
            return RA.RESET_GPU
        case CT.ROW_REMAP_FAILURE:
            return RA.REPLACE if d.get("failure") else RA.RESET_GPU
        case CT.DCGM_DIAG_FAILED:
            level = d.get("level")
            if level in (None, 1):
                return RA.REBOOT
            return RA.REPLACE if level in (3, 4) else RA.REIMAGE
        case CT.THERMAL_THROTTLING | CT.HEARTBEAT_LOST:
            return RA.REBOOT
        case CT.DISK_PRESSURE:
            return RA.REIMAGE
        case CT.SLOW_SPEED_CHECK:
            ratio = d.get("ratio_to_baseline")
            severe = isinstance(ratio, int | float) and ratio < 0.5
            return RA.REPLACE if severe else RA.REBOOT
    return RA.NONE


def _xid_action(details: Mapping[str, Any]) -> RepairAction:
    codes: list[int] = []
    for raw in details.get("xids") or ():
        with contextlib.suppress(TypeError, ValueError):
            codes.append(int(raw))
    if not codes:
        return RA.RESET_GPU  # an XID fault without codes: assume the common reset class
    best = RA.NONE
    for code in codes:
        if code in REPLACE_XIDS:
            action = RA.REPLACE
        elif code in REBOOT_XIDS or (
            code == 154 and details.get("recovery_action") == "node_reboot"
        ):
            action = RA.REBOOT
        elif code in RESET_XIDS:
            action = RA.RESET_GPU
        else:
            action = RA.NONE  # application-class, benign or unmapped: the job restarts
        if RUNG[action] > RUNG[best]:
            best = action
    return best


def clears(action: RepairAction, needed: RepairAction) -> bool:
    """Whether ``action`` fixes a fault that needs ``needed`` (MANUAL fixes nothing itself)."""
    if action not in RUNG or needed not in RUNG:
        return False
    return RUNG[action] >= RUNG[needed]


# ---------------------------------------------------------------- helpers


def master_port(job_id: str, attempt: int) -> int:
    """A port derived from the job and attempt, so every rank computes the same one."""
    return MASTER_PORT_BASE + zlib.crc32(f"{job_id}/{attempt}".encode()) % MASTER_PORT_SPAN


def managed_env(spec: WorkerSpec, master_addr: str = "127.0.0.1") -> dict[str, str]:
    """What a managed service adds to a replica's environment (the spec's env cannot
    override the service's own variables). Shared by LocalCompute and SlurmCompute."""
    port = master_port(spec.job_id, spec.attempt)
    cluster_spec = {
        "cluster": {"workerpool0": [f"{master_addr}:{port + r}" for r in range(spec.world_size)]},
        "environment": "cloud",
        "task": {"type": "workerpool0", "index": spec.rank, "node_id": spec.node_id},
        "job": {
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "world_size": spec.world_size,
            "base_output_directory": str(Path(spec.model_dir).parent),
        },
    }
    env = {"PYTHONUNBUFFERED": "1", **dict(spec.env)}
    env.update(
        CLOUD_ML_JOB_ID=spec.job_id,
        CLUSTER_SPEC=json.dumps(cluster_spec),
        RANK=str(spec.rank),
        WORLD_SIZE=str(spec.world_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
        AIP_CHECKPOINT_DIR=str(spec.checkpoint_dir),
        AIP_MODEL_DIR=str(spec.model_dir),
        AIP_TENSORBOARD_LOG_DIR=str(spec.tensorboard_dir),
        MTC_NODE_ID=spec.node_id,
        MTC_JOB_ATTEMPT=str(spec.attempt),
    )
    return env


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgrp, start time in clock ticks) from /proc, or None if there is no such pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2]), int(fields[19])


def _has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def _start_ticks(pid: int) -> int:
    stat = _proc_stat(pid)
    return stat[2] if stat else 0


def _launcher_alive(pid: int, start_ticks: int) -> bool:
    """Our launcher still runs: same pid *and* same start time (pids get reused); a zombie
    (exited, not yet reaped by its parent) counts as gone."""
    if _has_proc():
        stat = _proc_stat(pid)
        return stat is not None and stat[2] == start_ticks and stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    """Some process other than a zombie is still in the process group."""
    if not _has_proc():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                return True
    return False


def checkpoint_steps(directory: Path) -> dict[int, Path]:
    """Complete checkpoints in ``directory`` by step (see the module docstring)."""
    found: dict[int, Path] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return found
    for entry in entries:
        m = CHECKPOINT_RE.match(entry.name)
        if not m or (m.group(2) or "").lower() in IGNORED_SUFFIXES:
            continue
        if entry.suffix == ".npz" and not (entry.is_file() and zipfile.is_zipfile(entry)):
            continue
        found.setdefault(int(m.group(1)), entry)
    return found


@dataclass(frozen=True)
class WorkerStatus:
    """One rank of one attempt, as recorded (for `mtc job describe` and `mtc logs`)."""

    job_id: str
    attempt: int
    rank: int
    node_id: str
    pid: int
    log_path: str
    exit_code: int | None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY, data TEXT NOT NULL, requested_at REAL NOT NULL,
    ready_at REAL NOT NULL, provisioned INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0, next_heartbeat_at REAL,
    healthy_since REAL NOT NULL, cleared TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT, node_id TEXT NOT NULL, condition TEXT NOT NULL,
    needs TEXT NOT NULL, injected_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS repairs (
    node_id TEXT NOT NULL, attempt INTEGER NOT NULL, action TEXT NOT NULL,
    started_at REAL NOT NULL, completes_at REAL, completed_at REAL,
    PRIMARY KEY (node_id, attempt));
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, world_size INTEGER NOT NULL,
    checkpoint_dir TEXT NOT NULL, started_at REAL NOT NULL, signalled_at REAL,
    kill_deadline REAL, killed INTEGER NOT NULL DEFAULT 0,
    finalized INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS workers (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    node_id TEXT NOT NULL, pid INTEGER NOT NULL, start_ticks INTEGER NOT NULL,
    exit_file TEXT NOT NULL, log_path TEXT NOT NULL, started_at REAL NOT NULL,
    exit_code INTEGER, exited_at REAL, PRIMARY KEY (job_id, attempt, rank));
CREATE TABLE IF NOT EXISTS checkpoints (
    checkpoint_dir TEXT NOT NULL, step INTEGER NOT NULL, job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, path TEXT NOT NULL, seen_at REAL NOT NULL,
    PRIMARY KEY (checkpoint_dir, step));
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL, data TEXT NOT NULL,
    claimed_at REAL);
"""


class LocalCompute(FactState):
    """The ``Compute`` port on one machine: simulated nodes, subprocess workers."""

    DB_FILE = "compute.sqlite3"

    def __init__(
        self,
        state_dir: Path,
        emit: Callable[[Event], None],
        clock: Clock,
        *,
        repair_durations_s: Mapping[RepairAction, float] | None = None,
        provision_duration_s: float = 0.0,
        python: str = sys.executable,
        agent_interval_s: float = 1.0,
        heartbeats: bool = True,
    ) -> None:
        self.state_dir = Path(state_dir)
        self._emit = emit
        self._clock = clock
        self._durations = {**DEFAULT_REPAIR_DURATIONS_S, **(repair_durations_s or {})}
        self._provision_s = provision_duration_s
        self._python = shutil.which(python) or python
        self._interval = agent_interval_s
        self._heartbeats = heartbeats
        self._lock = threading.Lock()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._db: sqlite3.Connection | None = None
        self._children: set[int] = set()  # launchers we spawned: ours to reap
        with self._lock:
            self._connect().executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")

    # ------------------------------------------------------------ plumbing

    # ------------------------------------------------------------ nodes

    def provision_node(self, node: Node) -> None:
        """Record the node; ``poll()`` reports it up after ``provision_duration_s``."""
        now = self._clock.now()
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO nodes (node_id, data, requested_at, ready_at, healthy_since)"
                " VALUES (?, ?, ?, ?, ?)",
                (node.node_id, json.dumps(node.to_dict()), now, now + self._provision_s, now),
            )

    def cordon(self, node_id: str, reason: str) -> None:
        """Local nodes take work only as the control plane assigns it: nothing to fence."""

    def uncordon(self, node_id: str) -> None:
        """See cordon."""

    def delete_node(self, node_id: str) -> None:
        """Forget the node: no more heartbeats, repairs or reports."""
        with self._tx() as db:
            db.execute("UPDATE nodes SET deleted = 1 WHERE node_id = ?", (node_id,))

    def inject_fault(self, node_id: str, conditions: Sequence[Condition]) -> None:
        """Break a simulated node: keep its faults and report them at once (``mtc node
        fault``). Conditions with status ``false`` are reported but there is nothing to keep."""
        now = self._clock.now()
        needs = [required_action(c) for c in conditions]  # ValueError on a bad clears_with
        with self._tx() as db:
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            if node is None or node["deleted"]:
                raise LookupError(f"no such node: {node_id!r}")
            transient: list[Condition] = []
            for cond, need in zip(conditions, needs, strict=True):
                if cond.status is ConditionStatus.FALSE:
                    continue
                if need is RA.NONE:
                    transient.append(cond)
                    continue
                db.execute(
                    "INSERT INTO faults (node_id, condition, needs, injected_at) VALUES (?,?,?,?)",
                    (node_id, json.dumps(cond.to_dict()), need.value, now),
                )
            report = self._snapshot(db, node, transient)
            self._queue(db, NodeHealthReported(node_id, now, report, source="agent"))
        self._drain()

    def node_faults(self, node_id: str) -> list[tuple[Condition, RepairAction]]:
        """Faults the node still has, each with the cheapest repair that clears it."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT condition, needs FROM faults WHERE node_id = ? ORDER BY id", (node_id,)
            ).fetchall()
        return [(Condition.from_dict(json.loads(r["condition"])), RA(r["needs"])) for r in rows]

    def _snapshot(
        self, db: sqlite3.Connection, node: sqlite3.Row, extra: Sequence[Condition] = ()
    ) -> tuple[dict[str, Any], ...]:
        """Every condition type, faults as injected and the rest ``false``: what an agent
        that ran all its checks would report."""
        faults = [
            Condition.from_dict(json.loads(r["condition"]))
            for r in db.execute(
                "SELECT condition FROM faults WHERE node_id = ? ORDER BY id", (node["node_id"],)
            )
        ]
        by_type: dict[str, Condition] = {}
        for cond in [*faults, *extra]:
            prev = by_type.get(cond.type)
            by_type[cond.type] = cond if prev is None else _merge(prev, cond)
        cleared: dict[str, list[Any]] = json.loads(node["cleared"])
        out: list[dict[str, Any]] = []
        for ctype in ConditionType:
            if ctype.value in by_type:
                out.append(by_type.pop(ctype.value).to_dict())
                continue
            since, reason = cleared.get(ctype.value, (node["healthy_since"], HEALTHY_REASON))
            out.append(Condition(ctype.value, ConditionStatus.FALSE, reason, since).to_dict())
        out.extend(c.to_dict() for c in by_type.values())  # types this version does not know
        return tuple(out)

    # ------------------------------------------------------------ repairs

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        """Start a repair once per (node, attempt); a repeat, even with another action, is a
        no-op. MANUAL never completes by itself."""
        action = RA(action)
        now = self._clock.now()
        completes_at = None if action is RA.MANUAL else now + self._durations.get(action, 0.0)
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO repairs (node_id, attempt, action, started_at, completes_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (node_id, attempt, action.value, now, completes_at),
            )

    def _complete_repairs(self, db: sqlite3.Connection, now: float) -> None:
        due = db.execute(
            "SELECT * FROM repairs WHERE completed_at IS NULL AND completes_at <= ?"
            " ORDER BY completes_at, node_id, attempt",
            (now,),
        ).fetchall()
        for rep in due:
            node_id, attempt, action = rep["node_id"], rep["attempt"], RA(rep["action"])
            db.execute(
                "UPDATE repairs SET completed_at = ? WHERE node_id = ? AND attempt = ?",
                (now, node_id, attempt),
            )
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            if node is None:
                self._queue(
                    db, NodeRepairCompleted(node_id, action.value, attempt, False, "unknown node")
                )
                continue
            if node["deleted"]:
                continue
            faults = [
                (f["id"], json.loads(f["condition"])["type"], clears(action, RA(f["needs"])))
                for f in db.execute(
                    "SELECT id, condition, needs FROM faults WHERE node_id = ?", (node_id,)
                )
            ]
            fixed = [(fid, ctype) for fid, ctype, fixes in faults if fixes]
            remaining_types = {ctype for _, ctype, fixes in faults if not fixes}
            cleared = json.loads(node["cleared"])
            for fid, ctype in fixed:
                db.execute("DELETE FROM faults WHERE id = ?", (fid,))
                if ctype not in remaining_types:
                    cleared[ctype] = [now, f"cleared by {action.value}"]
            db.execute(
                "UPDATE nodes SET cleared = ? WHERE node_id = ?", (json.dumps(cleared), node_id)
            )
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            detail = f"cleared {len(fixed)} fault(s), {len(faults) - len(fixed)} remain"
            self._queue(db, NodeRepairCompleted(node_id, action.value, attempt, True, detail))
            report = self._snapshot(db, node)
            self._queue(db, NodeHealthReported(node_id, now, report, source="post-repair-check"))

    # ------------------------------------------------------------ workers

    def start_workers(self, workers: Sequence[WorkerSpec]) -> None:
        """Launch each (job, attempt, rank) once; a repeat is a no-op."""
        now = self._clock.now()
        launched: list[int] = []
        try:
            with self._tx() as db:
                self._start_new(db, workers, now, launched)
        except BaseException:
            for pid in launched:  # rolled back: nothing records them, so nothing may run
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            raise

    def _start_new(
        self, db: sqlite3.Connection, workers: Sequence[WorkerSpec], now: float, launched: list[int]
    ) -> None:
        for spec in sorted(workers, key=lambda w: (w.job_id, w.attempt, w.rank)):
            key = (spec.job_id, spec.attempt, spec.rank)
            if db.execute(
                "SELECT 1 FROM workers WHERE job_id = ? AND attempt = ? AND rank = ?", key
            ).fetchone():
                continue
            db.execute(
                "INSERT OR IGNORE INTO attempts"
                " (job_id, attempt, world_size, checkpoint_dir, started_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (*key[:2], spec.world_size, str(Path(spec.checkpoint_dir).absolute()), now),
            )
            pid, exit_file, log_path = self._launch(spec)
            launched.append(pid)
            self._children.add(pid)
            db.execute(
                "INSERT INTO workers (job_id, attempt, rank, node_id, pid, start_ticks,"
                " exit_file, log_path, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*key, spec.node_id, pid, _start_ticks(pid), exit_file, log_path, now),
            )

    def worker_env(self, spec: WorkerSpec) -> dict[str, str]:
        """The environment a managed service gives a replica (the spec's env cannot
        override the service's own variables)."""
        return {**os.environ, **managed_env(spec)}

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "logs" / safe_name(job_id) / f"attempt-{attempt}-rank-{rank}.log"

    def _launch(self, spec: WorkerSpec) -> tuple[int, str, str]:
        """Start the launcher in a new session: it survives us and records the exit code."""
        for d in (spec.checkpoint_dir, spec.model_dir, spec.tensorboard_dir):
            Path(d).mkdir(parents=True, exist_ok=True)
        log = self.log_path(spec.job_id, spec.attempt, spec.rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        run_dir = self.state_dir / "run" / safe_name(spec.job_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        exit_file = run_dir / f"attempt-{spec.attempt}-rank-{spec.rank}.exit"
        exit_file.unlink(missing_ok=True)
        argv = [self._python, str(LAUNCHER), "--exit-file", str(exit_file), "--", *spec.command]
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            pid = os.posix_spawn(
                self._python,
                argv,
                self.worker_env(spec),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, fd, 1),
                    (os.POSIX_SPAWN_DUP2, fd, 2),
                ],
                setsid=True,
            )
        finally:
            os.close(fd)
        return pid, str(exit_file), str(log)

    def workers(self, job_id: str | None = None) -> list[WorkerStatus]:
        """What was started, with exit codes seen so far (updated by ``poll()``)."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT * FROM workers WHERE ? IS NULL OR job_id = ?"
                " ORDER BY job_id, attempt, rank",
                (job_id, job_id),
            ).fetchall()
        return [
            WorkerStatus(
                r["job_id"],
                r["attempt"],
                r["rank"],
                r["node_id"],
                r["pid"],
                r["log_path"],
                r["exit_code"],
            )
            for r in rows
        ]

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM every rank now, SIGKILL in ``poll()`` after ``grace_s``. A repeat does not
        signal again; it can only bring the deadline closer."""
        now = self._clock.now()
        with self._tx() as db:
            att = self._attempt(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            deadline = now + max(0.0, grace_s)
            if att["signalled_at"] is None:
                for w in self._live_ranks(db, job_id, attempt):
                    _signal_rank(w, signal.SIGTERM)
                db.execute(
                    "UPDATE attempts SET signalled_at = ?, kill_deadline = ?"
                    " WHERE job_id = ? AND attempt = ?",
                    (now, deadline, job_id, attempt),
                )
            elif att["kill_deadline"] is None or deadline < att["kill_deadline"]:
                db.execute(
                    "UPDATE attempts SET kill_deadline = ? WHERE job_id = ? AND attempt = ?",
                    (deadline, job_id, attempt),
                )

    def stop_workers(self, job_id: str, attempt: int) -> None:
        """SIGKILL every rank of the attempt now; harmless if they are gone."""
        now = self._clock.now()
        with self._tx() as db:
            att = self._attempt(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            self._kill_attempt(db, job_id, attempt, now)

    def kill_all(self, wait_s: float = 2.0) -> None:
        """SIGKILL every live worker (tests, demo shutdown) and wait up to ``wait_s`` for
        them to go, so the next ``poll()`` reports them."""
        now = self._clock.now()
        with self._tx() as db:
            attempts = db.execute("SELECT * FROM attempts WHERE finalized = 0").fetchall()
            live = [w for a in attempts for w in self._live_ranks(db, a["job_id"], a["attempt"])]
            for att in attempts:
                self._kill_attempt(db, att["job_id"], att["attempt"], now)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            self._reap()
            if not any(_rank_running(w) for w in live):
                return
            time.sleep(0.01)

    def _reap(self) -> None:
        """Collect our own exited launchers so they do not linger as zombies. Safe: a pid we
        spawned cannot be reused until we reap it."""
        for pid in list(self._children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._children.discard(pid)

    @staticmethod
    def _attempt(db: sqlite3.Connection, job_id: str, attempt: int) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute(
            "SELECT * FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
        ).fetchone()
        return row

    @staticmethod
    def _live_ranks(db: sqlite3.Connection, job_id: str, attempt: int) -> list[sqlite3.Row]:
        return db.execute(
            "SELECT * FROM workers WHERE job_id = ? AND attempt = ? AND exit_code IS NULL"
            " ORDER BY rank",
            (job_id, attempt),
        ).fetchall()

    def _kill_attempt(self, db: sqlite3.Connection, job_id: str, attempt: int, now: float) -> None:
        for w in self._live_ranks(db, job_id, attempt):
            _signal_rank(w, signal.SIGKILL)
        db.execute(
            "UPDATE attempts SET killed = 1, kill_deadline = COALESCE(MIN(kill_deadline, ?), ?)"
            " WHERE job_id = ? AND attempt = ?",
            (now, now, job_id, attempt),
        )

    def _observe_workers(self, db: sqlite3.Connection, now: float) -> None:
        for att in db.execute("SELECT * FROM attempts WHERE finalized = 0").fetchall():
            job_id, attempt = att["job_id"], att["attempt"]
            if (
                att["kill_deadline"] is not None
                and att["kill_deadline"] <= now
                and not att["killed"]
            ):
                self._kill_attempt(db, job_id, attempt, now)
            for w in self._live_ranks(db, job_id, attempt):
                code = _exit_code(w)
                if code is not None:
                    db.execute(
                        "UPDATE workers SET exit_code = ?, exited_at = ?"
                        " WHERE job_id = ? AND attempt = ? AND rank = ?",
                        (code, now, job_id, attempt, w["rank"]),
                    )
            self._scan_checkpoints(db, att, now)
            ranks = db.execute(
                "SELECT rank, exit_code FROM workers WHERE job_id = ? AND attempt = ?"
                " ORDER BY rank",
                (job_id, attempt),
            ).fetchall()
            if not ranks or any(r["exit_code"] is None for r in ranks):
                continue
            worst = next((r["exit_code"] for r in ranks if r["exit_code"] != 0), 0)
            detail = ", ".join(f"rank {r['rank']}: {r['exit_code']}" for r in ranks)
            db.execute(
                "UPDATE attempts SET finalized = 1 WHERE job_id = ? AND attempt = ?",
                (job_id, attempt),
            )
            self._queue(db, JobWorkersExited(job_id, attempt, worst, f"exit codes {detail}"))

    def _scan_checkpoints(self, db: sqlite3.Connection, att: sqlite3.Row, now: float) -> None:
        directory = att["checkpoint_dir"]
        seen = {
            r["step"]
            for r in db.execute(
                "SELECT step FROM checkpoints WHERE checkpoint_dir = ?", (directory,)
            )
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

    def poll(self) -> None:
        """Turn what happened since the last poll (by any process) into events, once each."""
        now = self._clock.now()
        self._reap()
        with self._tx() as db:
            self._complete_provisioning(db, now)
            self._complete_repairs(db, now)
            self._observe_workers(db, now)
            if self._heartbeats:
                self._send_heartbeats(db, now)
        self._drain()

    def _complete_provisioning(self, db: sqlite3.Connection, now: float) -> None:
        for node in db.execute(
            "SELECT * FROM nodes WHERE provisioned = 0 AND deleted = 0 AND ready_at <= ?"
            " ORDER BY ready_at, node_id",
            (now,),
        ).fetchall():
            db.execute(
                "UPDATE nodes SET provisioned = 1, healthy_since = ?, next_heartbeat_at = ?"
                " WHERE node_id = ?",
                (now, now + self._interval, node["node_id"]),
            )
            self._queue(db, NodeProvisioned(node["node_id"], True, "simulated local node"))
            node = db.execute(
                "SELECT * FROM nodes WHERE node_id = ?", (node["node_id"],)
            ).fetchone()
            self._queue(db, NodeHealthReported(node["node_id"], now, self._snapshot(db, node)))

    def _send_heartbeats(self, db: sqlite3.Connection, now: float) -> None:
        interval = max(self._interval, 0.0)  # 0: a heartbeat on every poll
        for node in db.execute(
            "SELECT * FROM nodes WHERE provisioned = 1 AND deleted = 0 AND next_heartbeat_at <= ?"
            " ORDER BY node_id",
            (now,),
        ).fetchall():
            db.execute(
                "UPDATE nodes SET next_heartbeat_at = ? WHERE node_id = ?",
                (now + interval, node["node_id"]),
            )
            self._queue(db, NodeHealthReported(node["node_id"], now, self._snapshot(db, node)))


def _merge(prev: Condition, new: Condition) -> Condition:
    """Two faults of one type on a node: XIDs accumulate, anything else shows the newest."""
    if prev.type != CT.XID_ERROR:
        return new
    details = {**prev.details, **new.details}
    for key in ("xids", "gpus"):
        merged = list(prev.details.get(key) or [])
        merged += [v for v in new.details.get(key) or [] if v not in merged]
        if merged:
            details[key] = merged
    worst = (
        ConditionStatus.TRUE if ConditionStatus.TRUE in (prev.status, new.status) else new.status
    )
    reason = prev.reason if new.reason in ("", prev.reason) else f"{prev.reason}; {new.reason}"
    return Condition(prev.type, worst, reason, min(prev.since, new.since), details)


def _exit_code(worker: sqlite3.Row) -> int | None:
    """The rank's exit code once it is over, else None. The launcher leads its own group, so
    the rank is over when the exit file exists, or when launcher and group are both gone."""
    path = Path(worker["exit_file"])
    code = read_exit_file(path)
    if code is not None:
        return code
    if _rank_running(worker):
        return None
    code = read_exit_file(path)  # it may have written the file just before going
    return EXIT_KILLED if code is None else code


def _rank_running(worker: sqlite3.Row) -> bool:
    return _launcher_alive(worker["pid"], worker["start_ticks"]) or _group_alive(worker["pid"])


def read_exit_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        return 1  # cannot happen with an atomic writer; count it as a failure, not success


def _signal_rank(worker: sqlite3.Row, sig: signal.Signals) -> None:
    """SIGTERM goes to the launcher, which relays it to its group once; SIGKILL cannot be
    relayed, so it goes to the group itself. A launcher already gone is left alone unless
    something of its group is still running."""
    pid = worker["pid"]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sig == signal.SIGTERM and _launcher_alive(pid, worker["start_ticks"]):
            os.kill(pid, sig)
        elif _rank_running(worker):
            os.killpg(pid, sig)
