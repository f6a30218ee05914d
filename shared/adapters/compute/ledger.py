"""The attempt/repair ledger: what a Compute adapter has done and reported, once per key.

The port promises (``shared.ports.Compute``) are bookkeeping rules, the same for every
adapter: an attempt (job, attempt) starts once and ends in exactly one ``JobWorkersExited``;
each checkpoint step of a checkpoint directory is reported once (attempts of one job share the
directory); a repair runs once per (node, attempt), even if asked again with another action,
and completes once. The rules are here, once, as small functions over a ``LedgerStore``; the
records live where the adapter keeps its state:

* ``SqliteLedger``: in the adapter's sqlite file, inside the transaction that changes the rest
  of its state and queues the facts (``FactStore``), so a crash loses or repeats nothing. It
  uses these columns of the adapter's tables (adapters may add their own):
  ``attempts(job_id, attempt, world_size, checkpoint_dir, started_at, finalized,
  signalled_at, kill_deadline)``,
  ``repairs(node_id, attempt, action, started_at, completed_at)`` and ``checkpoints``
  (``CHECKPOINTS_SCHEMA``).
* ``MemoryLedger``: in memory, for the simulator and the test fake.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shared.adapters.compute.protocol import (
    attempt_exit,
    checkpoint_steps,
    progress_path,
    save_cost,
    tier_progress,
)
from shared.domain.events import (
    JobCheckpointSaved,
    JobFirstStep,
    JobWorkersExited,
    NodeRepairCompleted,
)

CHECKPOINTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    checkpoint_dir TEXT NOT NULL, step INTEGER NOT NULL, job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, path TEXT NOT NULL, seen_at REAL NOT NULL,
    PRIMARY KEY (checkpoint_dir, step));
"""


class LedgerStore(Protocol):
    """Claims on keys: each returns True exactly once per key, the first time."""

    def start_attempt(self, job_id: str, attempt: int, world_size: int, checkpoint_dir: str,
                      now: float, **extra: Any) -> bool: ...
    def end_attempt(self, job_id: str, attempt: int) -> bool:
        """False for an attempt that never started, as for one that ended already."""
        ...
    def attempt_ended(self, job_id: str, attempt: int) -> bool | None:
        """None: no such attempt."""
        ...
    def checkpoint(self, checkpoint_dir: str, step: int, job_id: str, attempt: int, path: str,
                   now: float) -> bool: ...
    def seen_steps(self, checkpoint_dir: str) -> set[int]: ...
    def start_repair(self, node_id: str, attempt: int, action: str, now: float,
                     **extra: Any) -> bool: ...
    def end_repair(self, node_id: str, attempt: int, now: float) -> bool: ...


# ---------------------------------------------------------------- the rules


def new_checkpoints(found: Mapping[int, Path], seen: Iterable[int]) -> list[tuple[int, Path]]:
    """Steps found on disk and not reported yet, oldest first."""
    known = set(seen)
    return [(step, path) for step, path in sorted(found.items()) if step not in known]


def report_checkpoints(store: LedgerStore, job_id: str, attempt: int, checkpoint_dir: str,
                       now: float, writers_done: bool = False) -> list[JobCheckpointSaved]:
    """The ``JobCheckpointSaved`` facts for checkpoints that appeared since the last scan.
    ``writers_done``: every rank of the attempt ended 0 or 75, so what it wrote under a name
    of its own is complete without waiting for it to settle (``protocol.learnt_steps``)."""
    seen = store.seen_steps(checkpoint_dir)
    found = checkpoint_steps(Path(checkpoint_dir), seen,
                             complete_before=math.inf if writers_done else None)
    out: list[JobCheckpointSaved] = []
    for step, path in new_checkpoints(found, seen):
        if store.checkpoint(checkpoint_dir, step, job_id, attempt, str(path), now):
            out.append(JobCheckpointSaved(job_id, attempt, step, str(path), now,
                                          save_s=save_cost(path)))
    return out


def report_tier_saves(store: LedgerStore, job_id: str, attempt: int, checkpoint_dir: str,
                      world_size: int, now: float) -> list[JobCheckpointSaved]:
    """``JobCheckpointSaved`` (with its ``tier``) for the newest step that every rank of the
    attempt holds in memory, and on its peer, by their heartbeats (``tier_progress``); once
    per (tier, step), and only a step newer than the last reported (the heartbeats' own
    rate bounds how often)."""
    out: list[JobCheckpointSaved] = []
    for tier, step, path, save_s, at in tier_progress(checkpoint_dir, attempt, world_size):
        key = f"{checkpoint_dir}#{tier}"
        seen = store.seen_steps(key)
        if seen and step <= max(seen):
            continue
        if store.checkpoint(key, step, job_id, attempt, path, now):
            out.append(JobCheckpointSaved(job_id, attempt, step, path, program_time(at, now),
                                          save_s=save_s, tier=tier))
    return out


def program_time(at: float | None, now: float) -> float:
    """When the program says something happened, as a fact's time: its own clock is read
    when it acts, where a scan reads its files seconds later; never after ``now`` (a clock
    ahead of ours, or a fake one in a test), and ``now`` when it did not say."""
    return now if at is None or not math.isfinite(at) else min(now, at)


def report_first_step(store: LedgerStore, job_id: str, attempt: int, checkpoint_dir: str,
                      now: float) -> JobFirstStep | None:
    """The attempt's ``JobFirstStep``, once, when rank 0's heartbeat (``MTC_PROGRESS_FILE``)
    shows this attempt past a step: the end of its startup, which the recovery policy weighs.
    Read as often as the tier heartbeats, so up to that late: ``at`` is when the program
    says its first step ended (``first_step_at``; null: not yet, after a restore), else the
    heartbeat's ``time``. None before, or for a program that writes no heartbeat."""
    key = f"{checkpoint_dir}#first-step"
    if attempt in store.seen_steps(key):  # reported: no need to read the heartbeat again
        return None
    try:
        beat = json.loads(progress_path(checkpoint_dir, 0).read_text())
    except (OSError, ValueError):
        return None
    step = beat.get("step") if isinstance(beat, dict) else None
    if beat.get("attempt") != attempt or not isinstance(step, int) or step <= 0:
        return None
    said = beat.get("first_step_at", beat.get("time"))
    if "first_step_at" in beat and not isinstance(said, int | float):
        return None  # restored, its first step not run yet
    at = program_time(float(said), now) if isinstance(said, int | float) else None
    if store.checkpoint(key, attempt, job_id, attempt, "", now):
        return JobFirstStep(job_id=job_id, attempt=attempt, step=step, at=at)
    return None


def checkpoint_saved(store: LedgerStore, job_id: str, attempt: int, checkpoint_dir: str,
                     step: int, path: str, now: float) -> JobCheckpointSaved | None:
    """One checkpoint an adapter learnt of another way (the simulator): reported once."""
    if store.checkpoint(checkpoint_dir, step, job_id, attempt, path, now):
        return JobCheckpointSaved(job_id, attempt, step, path, now)
    return None


def all_ranks_exited(codes: Mapping[int, int | None]) -> bool:
    """Every rank started (or expected) has left its exit code: the attempt is over."""
    return bool(codes) and all(code is not None for code in codes.values())


def workers_exited(store: LedgerStore, job_id: str, attempt: int, code: int,
                   detail: str = "", storage_full: str = "", launch_failed: str = ""
                   ) -> JobWorkersExited | None:
    """The attempt's one ``JobWorkersExited``; None if it was reported already.
    ``storage_full``: the full file system's path, when a full disk ended it;
    ``launch_failed``: why the platform could not start a rank, when that ended it."""
    if store.end_attempt(job_id, attempt):
        return JobWorkersExited(job_id, attempt, code, detail, storage_full, launch_failed)
    return None


def ranks_exited(store: LedgerStore, job_id: str, attempt: int,
                 codes: Mapping[int, int | None], note: str = "",
                 first_failed: int | None = None, storage_full: str = "",
                 launch_failed: str = "") -> JobWorkersExited | None:
    """End the attempt from its ranks' codes (a rank without one was killed); its code is
    ``first_failed``'s when a rank's failure ended the gang (``protocol.attempt_exit``)."""
    code, detail = attempt_exit(codes, first_failed)
    return workers_exited(store, job_id, attempt, code, detail + note, storage_full,
                          launch_failed)


def repair_completed(store: LedgerStore, node_id: str, attempt: int, action: str, ok: bool,
                     detail: str, now: float) -> NodeRepairCompleted | None:
    """The repair's one ``NodeRepairCompleted``; None if it completed already. The adapter
    follows an ok one with its post-repair ``NodeHealthReported``."""
    if store.end_repair(node_id, attempt, now):
        return NodeRepairCompleted(node_id, action, attempt, ok, detail)
    return None


def signal_deadline(signalled_at: float | None, kill_deadline: float | None, now: float,
                    grace_s: float) -> tuple[bool, float | None]:
    """A SIGTERM request for an attempt: (send the signal now?, the kill deadline to store, or
    None to keep the stored one). An attempt is signalled once; a repeat can only bring its
    kill deadline closer, never push it back."""
    deadline = now + max(0.0, grace_s)
    if signalled_at is None:
        return True, deadline
    if kill_deadline is None or deadline < kill_deadline:
        return False, deadline
    return False, None


# ---------------------------------------------------------------- stores


def attempt_row(db: sqlite3.Connection, job_id: str, attempt: int) -> sqlite3.Row | None:
    """The adapter's ``attempts`` row of (job, attempt), with the adapter's own columns."""
    row: sqlite3.Row | None = db.execute(
        "SELECT * FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
    ).fetchone()
    return row


class SqliteLedger:
    """A ``LedgerStore`` over an open sqlite transaction of the adapter (see the module
    docstring for the columns it uses). Column names in ``extra`` come from the adapter's
    code, never from a request."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def signal(self, att: sqlite3.Row, now: float, grace_s: float) -> bool:
        """Record a SIGTERM request on the attempt's row (``signal_deadline``); True when
        this is the first, so the caller sends the signal."""
        first, deadline = signal_deadline(att["signalled_at"], att["kill_deadline"], now, grace_s)
        if first:
            self.db.execute("UPDATE attempts SET signalled_at = ?, kill_deadline = ?"
                            " WHERE job_id = ? AND attempt = ?",
                            (now, deadline, att["job_id"], att["attempt"]))
        elif deadline is not None:
            self.db.execute("UPDATE attempts SET kill_deadline = ? WHERE job_id = ? AND attempt = ?",
                            (deadline, att["job_id"], att["attempt"]))
        return first

    def _insert(self, table: str, values: Mapping[str, Any]) -> bool:
        cols = ", ".join(values)
        marks = ", ".join("?" * len(values))
        cur = self.db.execute(
            f"INSERT OR IGNORE INTO {table} ({cols}) VALUES ({marks})", tuple(values.values())
        )
        return cur.rowcount > 0

    def start_attempt(self, job_id: str, attempt: int, world_size: int, checkpoint_dir: str,
                      now: float, **extra: Any) -> bool:
        return self._insert("attempts", {
            "job_id": job_id, "attempt": attempt, "world_size": world_size,
            "checkpoint_dir": checkpoint_dir, "started_at": now, **extra,
        })

    def end_attempt(self, job_id: str, attempt: int) -> bool:
        cur = self.db.execute(
            "UPDATE attempts SET finalized = 1 WHERE job_id = ? AND attempt = ? AND finalized = 0",
            (job_id, attempt),
        )
        return cur.rowcount > 0

    def attempt_ended(self, job_id: str, attempt: int) -> bool | None:
        row = self.db.execute(
            "SELECT finalized FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
        ).fetchone()
        return None if row is None else bool(row[0])

    def checkpoint(self, checkpoint_dir: str, step: int, job_id: str, attempt: int, path: str,
                   now: float) -> bool:
        return self._insert("checkpoints", {
            "checkpoint_dir": checkpoint_dir, "step": step, "job_id": job_id,
            "attempt": attempt, "path": path, "seen_at": now,
        })

    def seen_steps(self, checkpoint_dir: str) -> set[int]:
        return {int(r[0]) for r in self.db.execute(
            "SELECT step FROM checkpoints WHERE checkpoint_dir = ?", (checkpoint_dir,))}

    def start_repair(self, node_id: str, attempt: int, action: str, now: float,
                     **extra: Any) -> bool:
        return self._insert("repairs", {
            "node_id": node_id, "attempt": attempt, "action": action, "started_at": now, **extra,
        })

    def end_repair(self, node_id: str, attempt: int, now: float) -> bool:
        cur = self.db.execute(
            "UPDATE repairs SET completed_at = ? WHERE node_id = ? AND attempt = ?"
            " AND completed_at IS NULL",
            (now, node_id, attempt),
        )
        return cur.rowcount > 0


@dataclass
class AttemptRecord:
    world_size: int
    checkpoint_dir: str
    started_at: float
    ended: bool = False
    ranks: dict[int, int | None] = field(default_factory=dict)  # rank -> exit code (None: runs)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RepairRecord:
    action: str
    started_at: float
    completed_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class MemoryLedger:
    """A ``LedgerStore`` in memory (the simulator, the test fake)."""

    attempts: dict[tuple[str, int], AttemptRecord] = field(default_factory=dict)
    repairs: dict[tuple[str, int], RepairRecord] = field(default_factory=dict)
    checkpoints: dict[str, dict[int, tuple[str, int, str]]] = field(default_factory=dict)

    def start_attempt(self, job_id: str, attempt: int, world_size: int, checkpoint_dir: str,
                      now: float, **extra: Any) -> bool:
        if (job_id, attempt) in self.attempts:
            return False
        self.attempts[job_id, attempt] = AttemptRecord(world_size, checkpoint_dir, now,
                                                       extra=dict(extra))
        return True

    def end_attempt(self, job_id: str, attempt: int) -> bool:
        rec = self.attempts.get((job_id, attempt))
        if rec is None or rec.ended:  # never started, or reported already
            return False
        rec.ended = True
        return True

    def attempt_ended(self, job_id: str, attempt: int) -> bool | None:
        rec = self.attempts.get((job_id, attempt))
        return None if rec is None else rec.ended

    def start_rank(self, job_id: str, attempt: int, rank: int) -> bool:
        """A rank of a started attempt launched; True the first time."""
        rec = self.attempts[job_id, attempt]
        if rank in rec.ranks:
            return False
        rec.ranks[rank] = None
        return True

    def rank_exited(self, job_id: str, attempt: int, rank: int, code: int) -> bool:
        """A rank left its exit code; True the first time."""
        rec = self.attempts.get((job_id, attempt))
        if rec is None or rec.ranks.get(rank) is not None:
            return False
        rec.ranks[rank] = code
        return True

    def checkpoint(self, checkpoint_dir: str, step: int, job_id: str, attempt: int, path: str,
                   now: float) -> bool:
        steps = self.checkpoints.setdefault(checkpoint_dir, {})
        if step in steps:
            return False
        steps[step] = (job_id, attempt, path)
        return True

    def seen_steps(self, checkpoint_dir: str) -> set[int]:
        return set(self.checkpoints.get(checkpoint_dir, ()))

    def start_repair(self, node_id: str, attempt: int, action: str, now: float,
                     **extra: Any) -> bool:
        if (node_id, attempt) in self.repairs:
            return False
        self.repairs[node_id, attempt] = RepairRecord(action, now, extra=dict(extra))
        return True

    def end_repair(self, node_id: str, attempt: int, now: float) -> bool:
        rec = self.repairs.get((node_id, attempt))
        if rec is None or rec.completed_at is not None:
            return False
        rec.completed_at = now
        return True
