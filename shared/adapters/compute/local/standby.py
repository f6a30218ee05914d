"""Warm standby processes on the local compute (ByteRobust's warm standbys, HyperPod's
process-level restart): a rank whose process died is given a process that has started,
imported and declared already, instead of a new one.

For a job whose program declared in-process restart (a live rank answered in its
``<control>.state``), the compute keeps one standby per node of the job: the job's command
and the environment of a rank on that node, with ``MTC_STANDBY=1`` and its own control
file. The program holds before training (``InProcessRestart.standby``). When the next
attempt is in place (or a hot swap, on the nodes that keep their memory) and a rank has no
parked process of its own, ``take`` gives it the node's standby with a ``restart`` order (the
same path as a parked process), and the next ``poll`` starts a new standby.

Bounded: one row (so at most one process) per job and node; a standby that dies is started
again at most ``MAX_LAUNCHES`` times per job and node; never a rank (its own table); ended
with the job (all ranks exited 0, ``stop_workers``, ``kill_all``), on a node the job left,
and when the job has had no live attempt for ``idle_s``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from mtc_program import inprocess
from mtc_program import protocol as p
from mtc_program.inprocess import HOLD, RESTART, STANDBY, Order
from shared.adapters.compute.local import sandbox
from shared.adapters.compute.local.inprocess import control_path
from shared.adapters.compute.local.procs import (
    end_group,
    rank_running,
    remove_rank_tmp,
    spawn_launcher,
    start_ticks,
)
from shared.adapters.compute.protocol import host_dir, safe_name
from shared.adapters.compute.warm_orders import next_generation
from shared.ports import WorkerSpec

MAX_LAUNCHES = 8  # per job and node: a program that cannot stand by stops being started
# a standby's lease (a hold order's deadline): renewed at half its life by every poll while
# the standby is wanted, so one that nobody renews (the server gone) ends within this long
LEASE_S = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS standbys (
    job_id TEXT NOT NULL, node_id TEXT NOT NULL, command TEXT NOT NULL, env TEXT NOT NULL,
    pid INTEGER, start_ticks INTEGER, exit_file TEXT, control_file TEXT,
    launches INTEGER NOT NULL DEFAULT 0, idle_since REAL, buckets TEXT,
    PRIMARY KEY (job_id, node_id));
"""


def migrate(db: sqlite3.Connection) -> None:
    """A state file from before standbys knew their job's buckets gets the column."""
    if "buckets" not in {r["name"] for r in db.execute("PRAGMA table_info(standbys)")}:
        db.execute("ALTER TABLE standbys ADD COLUMN buckets TEXT")

# (command, environment, job id, node id, buckets) -> (launcher pid, start ticks, exit file,
# control)
Launch = Callable[[Sequence[str], Mapping[str, str], str, str, Sequence[str]],
                  tuple[int, int, str, str]]


# (spec, environment, exit file, control file, log) -> the sandbox plan, or None: unsandboxed
Plan = Callable[[WorkerSpec, Mapping[str, str], Path, Path, Path], Path | None]


def launcher(python: str, state_dir: Path, children: set[int], plan: Plan | None = None,
             gcs_root: str | None = None) -> Launch:
    """Start a standby under the launcher (its own session, exit file and control file, its
    output in ``logs/<job>/standby-<node>.log`` until it is given a rank), in the sandbox a
    rank of its job gets (``plan``: the job's uid, its own directories only, found on the
    host: a ``gs://`` directory of its environment is under ``gcs_root``)."""
    def launch(command: Sequence[str], env: Mapping[str, str], job_id: str, node_id: str,
               buckets: Sequence[str]) -> tuple[int, int, str, str]:
        run_dir = state_dir / "run" / safe_name(job_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        exit_file = run_dir / f"standby-{safe_name(node_id)}-{time.time_ns()}.exit"
        control = control_path(exit_file)
        control.parent.mkdir(parents=True, exist_ok=True)
        log = state_dir / "logs" / safe_name(job_id) / f"standby-{safe_name(node_id)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        full = {**env, inprocess.RESTART_FILE: str(control)}
        inprocess.atomic_write(control, Order(1, HOLD, deadline=time.time() + LEASE_S).to_json())
        spec = WorkerSpec(job_id, 0, int(env.get(p.RANK, "0") or 0),
                          int(env.get(p.WORLD_SIZE, "1") or 1), node_id, tuple(command), (),
                          host_dir(env.get(p.CHECKPOINT_DIR, ""), gcs_root),
                          host_dir(env.get(p.MODEL_DIR, ""), gcs_root),
                          host_dir(env.get(p.TENSORBOARD_LOG_DIR, ""), gcs_root), tuple(buckets))
        sandboxed = plan(spec, full, exit_file, control, log) if plan is not None else None
        if sandboxed is not None:  # its storage at the paths the job sees, as a rank's
            full.update(sandbox.seen_in_sandbox(full))
        pid = spawn_launcher(python, exit_file, command, full, log, sandboxed)
        children.add(pid)
        return pid, start_ticks(pid), str(exit_file), str(control)
    return launch


def want(db: sqlite3.Connection, job_id: str, node_id: str, command: Sequence[str],
         env: Mapping[str, str], buckets: Sequence[str] = ()) -> None:
    """The job runs a rank on ``node_id``: keep a standby there (started by ``launch_due``
    once the job's program has declared), with this attempt's command and environment (and
    the job's buckets, which its sandbox binds packages from)."""
    db.execute("INSERT INTO standbys (job_id, node_id, command, env, buckets)"
               " VALUES (?, ?, ?, ?, ?) ON CONFLICT (job_id, node_id) DO UPDATE SET"
               " command = excluded.command, env = excluded.env, buckets = excluded.buckets,"
               " idle_since = NULL",
               (job_id, node_id, json.dumps(list(command)), json.dumps({**env, STANDBY: "1"}),
                json.dumps(list(buckets))))


def _declared(db: sqlite3.Connection, job_id: str) -> bool:
    """A live rank of the job's newest attempt declared in-process restart."""
    rows = db.execute("SELECT control_file FROM workers WHERE job_id = ? AND exit_code IS NULL"
                      " AND control_file IS NOT NULL", (job_id,)).fetchall()
    return any(inprocess.read_state(Path(r["control_file"])) for r in rows)


def launch_due(db: sqlite3.Connection, launch: Launch) -> None:
    """Start the standbys that are wanted and not running (a taken one, a dead one, a new
    node), for jobs whose program declared."""
    declared: dict[str, bool] = {}
    for row in db.execute("SELECT * FROM standbys").fetchall():
        if row["pid"] is not None and rank_running(row):
            continue
        if row["launches"] >= MAX_LAUNCHES or row["idle_since"] is not None:
            continue
        job = row["job_id"]
        if job not in declared:
            declared[job] = _declared(db, job)
        if not declared[job]:
            continue
        pid, ticks, exit_file, control = launch(json.loads(row["command"]),
                                                json.loads(row["env"]), job, row["node_id"],
                                                json.loads(row["buckets"] or "[]"))
        db.execute("UPDATE standbys SET pid = ?, start_ticks = ?, exit_file = ?,"
                   " control_file = ?, launches = launches + 1 WHERE job_id = ? AND node_id = ?",
                   (pid, ticks, exit_file, control, job, row["node_id"]))


def take(db: sqlite3.Connection, job_id: str, node_id: str, env: Mapping[str, str],
         log_path: Path) -> sqlite3.Row | None:
    """The node's standby for a rank of the next attempt (a ``restart`` order with its
    environment and log), or None: none is ready (not started, or not declared yet)."""
    row: sqlite3.Row | None = db.execute(
        "SELECT * FROM standbys WHERE job_id = ? AND node_id = ? AND pid IS NOT NULL",
        (job_id, node_id)).fetchone()
    if row is None or not rank_running(row):
        return None
    control = Path(row["control_file"])
    state = inprocess.read_state(control)
    if "pid" not in state:  # still importing: an order now would be taken for an old one
        return None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    gen = next_generation(control, state)
    inprocess.atomic_write(control, Order(gen, RESTART, dict(env), str(log_path)).to_json())
    db.execute("UPDATE standbys SET pid = NULL, start_ticks = NULL, launches = 0"
               " WHERE job_id = ? AND node_id = ?", (job_id, node_id))
    return row


def renew(db: sqlite3.Connection, now: float) -> None:
    """Renew the lease of every live standby past half of it (``LEASE_S``)."""
    for row in db.execute("SELECT control_file FROM standbys WHERE pid IS NOT NULL"
                          " AND idle_since IS NULL").fetchall():
        control = Path(row["control_file"])
        current = inprocess.read_order(control)
        if current is None or current.action != HOLD or current.deadline is None:
            continue  # given a rank already, or not ours to renew
        if current.deadline - now < LEASE_S / 2:
            gen = next_generation(control, inprocess.read_state(control))
            inprocess.atomic_write(control, Order(gen, HOLD, deadline=now + LEASE_S).to_json())


def end(db: sqlite3.Connection, job_id: str | None = None,
        keep_nodes: Sequence[str] | None = None) -> None:
    """End the standbys of ``job_id`` (None: every job), but for those on ``keep_nodes``.
    SIGKILL: a standby holds no state to save."""
    rows = db.execute("SELECT * FROM standbys WHERE ? IS NULL OR job_id = ?",
                      (job_id, job_id)).fetchall()
    for row in rows:
        if keep_nodes is not None and row["node_id"] in keep_nodes:
            continue
        if row["pid"] is not None:
            end_group(row)
        if row["exit_file"]:
            remove_rank_tmp(row["exit_file"])
        db.execute("DELETE FROM standbys WHERE job_id = ? AND node_id = ?",
                   (row["job_id"], row["node_id"]))


def end_idle(db: sqlite3.Connection, now: float, idle_s: float) -> None:
    """End the standbys of jobs with no live attempt for ``idle_s`` (the job ended, or it
    waits for nodes: a requeue starts them again where it lands)."""
    for row in db.execute("SELECT DISTINCT job_id FROM standbys").fetchall():
        job = row["job_id"]
        live = db.execute("SELECT 1 FROM attempts WHERE job_id = ? AND finalized = 0",
                          (job,)).fetchone()
        if live is not None:
            db.execute("UPDATE standbys SET idle_since = NULL WHERE job_id = ?", (job,))
            continue
        db.execute("UPDATE standbys SET idle_since = ? WHERE job_id = ? AND idle_since IS NULL",
                   (now, job))
        since = db.execute("SELECT MIN(idle_since) FROM standbys WHERE job_id = ?",
                           (job,)).fetchone()[0]
        if since is not None and now - since >= idle_s:
            end(db, job)
