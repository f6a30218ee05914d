"""Reads of the local compute's ledger for its views: the workers started, each rank's log
file, where the previous attempt's ranks ran, and what an attempt's exit says (the failing
rank's message and last output for a job's error, and whether a full disk or the platform's
failure to start a rank ended it)."""

from __future__ import annotations

import sqlite3

from shared.adapters.compute import disk_evidence, launch_evidence
from shared.adapters.compute.proc_watch import RankProc
from shared.adapters.compute.protocol import ExitCode, with_message
from shared.adapters.compute.worker_logs import LogFile, tail_note
from shared.domain.storage import StorageFloor


def workers(db: sqlite3.Connection, job_id: str | None) -> list[sqlite3.Row]:
    """Every rank started (of ``job_id``, or of every job), attempt by attempt."""
    return db.execute("SELECT * FROM workers WHERE ? IS NULL OR job_id = ?"
                      " ORDER BY job_id, attempt, rank", (job_id, job_id)).fetchall()


def node_of(db: sqlite3.Connection, att: sqlite3.Row) -> dict[int, str]:
    """The node of each rank of the attempt ``att``."""
    return {r["rank"]: r["node_id"] for r in db.execute(
        "SELECT rank, node_id FROM workers WHERE job_id = ? AND attempt = ?",
        (att["job_id"], att["attempt"]))}


def rank_procs(db: sqlite3.Connection, att: sqlite3.Row) -> dict[int, RankProc]:
    """Each live rank of the attempt ``att``: its launcher's pid, output and node."""
    return {r["rank"]: RankProc(r["pid"], r["log_path"], r["node_id"])
            for r in live_ranks(db, att["job_id"], att["attempt"])}


def log_files(db: sqlite3.Connection, job_id: str) -> list[LogFile]:
    """Each rank's output of each attempt, one file apiece (``worker_logs``)."""
    rows = db.execute(
        "SELECT w.attempt, w.rank, w.log_path, w.exit_code, a.finalized FROM workers w"
        " JOIN attempts a ON a.job_id = w.job_id AND a.attempt = w.attempt"
        " WHERE w.job_id = ? ORDER BY w.attempt, w.rank", (job_id,)).fetchall()
    return [LogFile(r["attempt"], r["rank"], r["log_path"],
                    r["exit_code"] is not None or bool(r["finalized"])) for r in rows]


def failure_note(db: sqlite3.Connection, att: sqlite3.Row, codes: dict[int, int | None],
                 failed_rank: int | None) -> str:
    """The failing rank's last output, for the job's error (none for a clean exit or a
    preemption: those say nothing of a failure)."""
    rank = failed_rank if failed_rank is not None else next(
        (r for r, c in sorted(codes.items()) if c not in (0, None)), None)
    if rank is None or codes.get(rank) in (0, ExitCode.PREEMPTED):
        return ""
    row = db.execute("SELECT log_path FROM workers WHERE job_id = ? AND attempt = ? AND "
                     "rank = ?", (att["job_id"], att["attempt"], rank)).fetchone()
    return tail_note(row["log_path"] if row else None, rank)


def exit_note(db: sqlite3.Connection, att: sqlite3.Row, ranks: list[sqlite3.Row],
              codes: dict[int, int | None], failed_rank: int | None, floor: StorageFloor
              ) -> tuple[str, str, str]:
    """The ended attempt's note for its ``JobWorkersExited`` detail, the path of the file
    system that was full when a rank exited non-zero ("" when none: ``disk_evidence``), and
    why the platform could not start the rank that ended it ("" when none:
    ``launch_evidence``)."""
    files = {r["rank"]: r["exit_file"] for r in ranks}
    full, disk = disk_evidence.evidence(files, codes, failed_rank, floor)
    launch, not_started = launch_evidence.evidence(files, codes, failed_rank)
    note = with_message("", files, failed_rank) + failure_note(db, att, codes, failed_rank)
    return note + disk + not_started, full, launch


def placement_before(db: sqlite3.Connection, job_id: str, attempt: int) -> tuple[str, ...]:
    """The nodes of the job's previous attempt by rank (where its peer copies are)."""
    prev = db.execute("SELECT MAX(attempt) FROM workers WHERE job_id = ? AND attempt < ?",
                      (job_id, attempt)).fetchone()[0]
    if prev is None:
        return ()
    rows = db.execute("SELECT node_id FROM workers WHERE job_id = ? AND attempt = ?"
                      " ORDER BY rank", (job_id, prev)).fetchall()
    return tuple(r["node_id"] for r in rows)


def live_ranks(db: sqlite3.Connection, job_id: str, attempt: int) -> list[sqlite3.Row]:
    """The attempt's ranks with no exit code yet, by rank."""
    return db.execute("SELECT * FROM workers WHERE job_id = ? AND attempt = ? AND exit_code IS NULL"
                      " ORDER BY rank", (job_id, attempt)).fetchall()


def migrate(db: sqlite3.Connection) -> None:
    """A state file from before gangs gets their column."""
    cols = {r["name"] for r in db.execute("PRAGMA table_info(attempts)")}
    if "failed_rank" not in cols:
        db.execute("ALTER TABLE attempts ADD COLUMN failed_rank INTEGER")
