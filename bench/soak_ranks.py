"""What a stuck job's ranks are doing, for the soak's stuck-job message: each rank of the
attempt the compute ledger knows (its pid's state from ``/proc``, its exit, how long ago its
log last grew and the log's last line), so a failure says what the job was waiting for.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from shared.adapters.compute.proc_watch import children_map, python_stack, tree

STACK_LINES = 14  # of the program's innermost frames, enough to see what it waits on

PROC_STATES = {"R": "running", "S": "sleeping", "D": "in disk wait", "T": "stopped",
               "t": "traced", "Z": "zombie", "X": "dead", "I": "idle"}


def proc_state(pid: int, start_ticks: int) -> str:
    """The process's state, or "gone" when the pid is free or was reused."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    fields = text.rsplit(")", 1)[1].split()
    if len(fields) > 19 and start_ticks and int(fields[19]) != start_ticks:
        return "gone (pid reused)"
    return PROC_STATES.get(fields[0], fields[0])


def last_line(path: Path, limit: int = 160) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return (lines[-1][:limit] if lines else "(empty log)")


def log_age(path: Path, now: float) -> str:
    try:
        return f"{now - path.stat().st_mtime:.0f} s"
    except OSError:
        return "?"


def program_stack(launcher: int) -> str:
    """The Python stack of the launcher's newest descendant (the program), by py-spy."""
    below = [p for p in tree(launcher, children_map()) if p != launcher]
    if not below:
        return "no program process under its launcher"
    lines = python_stack(below[-1]).splitlines()
    threads = [i for i, x in enumerate(lines) if x.startswith("Thread ")]
    lines = lines[threads[0]:] if threads else lines  # py-spy's header names the process
    return " / ".join(x.strip() for x in lines[:STACK_LINES])


def describe_ranks(db: sqlite3.Connection, job_id: str, attempt: int) -> str:
    """One line per rank of the job's newest attempt in the compute ledger (which may be
    ahead of or behind the control plane's attempt: both are said)."""
    rows = db.execute(
        "SELECT * FROM workers WHERE job_id = ? AND attempt = (SELECT MAX(attempt) FROM "
        "workers WHERE job_id = ?) ORDER BY rank", (job_id, job_id)).fetchall()
    if not rows:
        return "; compute ledger: no workers for the job"
    now = time.time()
    parts = []
    for r in rows:
        ended = (f"exited {r['exit_code']}" if r["exit_code"] is not None
                 else proc_state(r["pid"], r["start_ticks"]))
        log = Path(r["log_path"])
        stack = "" if r["exit_code"] is not None or ended.startswith("gone") else (
            f"; stack: {program_stack(r['pid'])}")
        parts.append(f"rank {r['rank']} on {r['node_id']} pid {r['pid']} {ended}, log "
                     f"grew {log_age(log, now)} ago: {last_line(log)!r}{stack}")
    ledger = rows[0]["attempt"]
    head = f"compute ledger attempt {ledger}" + ("" if ledger == attempt else
                                                 f" (control plane: {attempt})")
    return f"; {head}: " + " | ".join(parts)
