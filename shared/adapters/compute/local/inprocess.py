"""In-process restart on the local compute: a live rank is held, not killed, and the next
attempt takes its process (the program side: ``mtc_program.inprocess``).

Every rank is started with ``MTC_RESTART_FILE`` (its control file, beside its exit file). A
program that declared it restarts in process (``<control>.state`` with its pid, a live
process of the rank's group) is, where the gang would SIGTERM it (another rank failed,
or ``signal_workers``), sent a ``hold`` order instead: it makes its preemption save, answers
``held`` and waits. Once it has answered, the rank counts as exited 75 for its attempt (what
it would have exited with) and its process is *parked* (table ``parked``), so the attempt
ends and the control plane decides as it would for an exit.

The next attempt with a recovery plan (in place, hot swap, scale down) gives each rank on
a node that is not fresh a parked process of the job on that node, if one is alive: a
``restart`` order carries the rank's new managed environment and log, and the workers row
records the same pid under the new attempt. Only ranks without one spawn.
A requeue (no plan), a fresh node, or a parked process not taken within ``park_s`` gets a
process restart: SIGTERM (the held program exits 75 at once: its save is complete), SIGKILL
of what is left after the grace period. ``warm.LocalWarm`` puts this and the standbys
behind the ``WarmProcesses`` port.
"""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from mtc_program import inprocess
from shared.adapters.compute import warm_orders
from shared.adapters.compute.local.procs import end_group, rank_running, signal_rank
from shared.adapters.compute.protocol import ExitCode
from shared.adapters.compute.warm_orders import IN_PROCESS_MODES, PARK_S, RESTART_FILE

__all__ = ["IN_PROCESS_MODES", "PARK_S", "RESTART_FILE", "control_path", "end_parked", "held",
           "hold", "kill_parked", "migrate", "park", "take"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS parked (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    node_id TEXT NOT NULL, pid INTEGER NOT NULL, start_ticks INTEGER NOT NULL,
    exit_file TEXT NOT NULL, control_file TEXT NOT NULL, deadline REAL NOT NULL,
    ending INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, attempt, rank));
"""


def migrate(db: sqlite3.Connection) -> None:
    """Workers rows of a state file from before in-process restarts get the columns."""
    cols = {r["name"] for r in db.execute("PRAGMA table_info(workers)")}
    if "control_file" not in cols:
        db.execute("ALTER TABLE workers ADD COLUMN control_file TEXT")
    if "hold_gen" not in cols:
        db.execute("ALTER TABLE workers ADD COLUMN hold_gen INTEGER")


def control_path(exit_file: Path) -> Path:
    """A process's control file, in a directory of its own beside its first attempt's exit
    file (it keeps it after): a sandboxed rank gets that directory and no other of the run's."""
    return exit_file.with_name(exit_file.name.removesuffix(".exit") + ".ctl") / "restart.json"


def _declared_pid(worker: sqlite3.Row) -> int | None:
    """The pid of the rank's program if it declared in-process restart and runs in the
    rank's process group, else None."""
    control = worker["control_file"]
    if not control:
        return None
    pid = inprocess.read_state(Path(control)).get("pid")
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return pid if fields[0] not in ("Z", "X") and int(fields[2]) == worker["pid"] else None


def hold(db: sqlite3.Connection, worker: sqlite3.Row, park_s: float) -> bool:
    """Ask a rank that declared in-process restart to hold (True), else False: the caller
    SIGTERMs it. A rank asked already is not asked again."""
    if worker["hold_gen"] is not None:
        return True
    if _declared_pid(worker) is None:
        return False
    gen = warm_orders.write_hold(Path(worker["control_file"]), warm_orders.hold_deadline(park_s))
    db.execute("UPDATE workers SET hold_gen = ? WHERE job_id = ? AND attempt = ? AND rank = ?",
               (gen, worker["job_id"], worker["attempt"], worker["rank"]))
    return True


def held(worker: sqlite3.Row) -> bool:
    """The rank answered its hold (its save is complete) and its process still runs."""
    gen = worker["hold_gen"]
    if gen is None or not warm_orders.held_since(Path(worker["control_file"]), gen):
        return False
    return rank_running(worker)


def park(db: sqlite3.Connection, worker: sqlite3.Row, now: float, park_s: float) -> int:
    """Record the held rank's process as parked; the code its attempt records for it."""
    db.execute(
        "INSERT OR REPLACE INTO parked (job_id, attempt, rank, node_id, pid, start_ticks,"
        " exit_file, control_file, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (worker["job_id"], worker["attempt"], worker["rank"], worker["node_id"], worker["pid"],
         worker["start_ticks"], worker["exit_file"], worker["control_file"], now + park_s))
    return int(ExitCode.PREEMPTED)


def take(db: sqlite3.Connection, job_id: str, node_id: str, env: Mapping[str, str],
         log_path: Path) -> sqlite3.Row | None:
    """A parked process of ``job_id`` on ``node_id`` for the next attempt (a ``restart``
    order with its new environment and log), or None: spawn one."""
    rows: list[sqlite3.Row] = db.execute("SELECT * FROM parked WHERE job_id = ? AND node_id = ?"
                                         " ORDER BY attempt DESC, rank", (job_id, node_id)
                                         ).fetchall()
    for row in rows:
        db.execute("DELETE FROM parked WHERE job_id = ? AND attempt = ? AND rank = ?",
                   (row["job_id"], row["attempt"], row["rank"]))
        if not rank_running(row):
            continue
        log_path.parent.mkdir(parents=True, exist_ok=True)
        warm_orders.write_restart(Path(row["control_file"]), env, str(log_path))
        return row
    return None


def end_parked(db: sqlite3.Connection, now: float, grace_s: float,
               job_id: str | None = None) -> None:
    """End the parked processes of ``job_id`` (None: those whose time to be taken is over):
    SIGTERM now, SIGKILL of what is left once ``grace_s`` has passed (a later call)."""
    rows = db.execute(
        "SELECT * FROM parked WHERE (? IS NULL AND deadline <= ?) OR job_id = ?",
        (job_id, now, job_id)).fetchall()
    for row in rows:
        key = (row["job_id"], row["attempt"], row["rank"])
        if not rank_running(row):
            db.execute("DELETE FROM parked WHERE job_id = ? AND attempt = ? AND rank = ?", key)
        elif not row["ending"]:
            signal_rank(row, signal.SIGTERM)
            db.execute("UPDATE parked SET ending = 1, deadline = ? WHERE job_id = ? AND"
                       " attempt = ? AND rank = ?", (now + grace_s, *key))
        elif row["deadline"] <= now:
            end_group(row)
            db.execute("DELETE FROM parked WHERE job_id = ? AND attempt = ? AND rank = ?", key)


def kill_parked(db: sqlite3.Connection) -> None:
    """SIGKILL every parked process now (tests, demo shutdown)."""
    for row in db.execute("SELECT * FROM parked").fetchall():
        end_group(row)
    db.execute("DELETE FROM parked")
