"""What the ranks' files say about a running attempt, turned into facts at a bounded rate
(the local and the Slurm adapters alike): durable checkpoints (every poll: they are few),
and every ``TIER_SCAN_S`` the ranks' heartbeats: tier saves, the attempt's first step, what its
ranks restored (also when it ends), per-rank progress (hangs, stragglers), and for programs
that report none, their processes as the node sees them (``proc_watch``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping

from mtc_program.protocol import GRACEFUL
from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.ledger import (
    report_checkpoints,
    report_first_step,
    report_tier_saves,
)
from shared.adapters.compute.proc_watch import ProcWatch, RankProc
from shared.adapters.compute.rank_progress import RankWatch
from shared.adapters.compute.restores import report_restore

TIER_SCAN_S = 2.0  # how often the ranks' heartbeats are read for tier saves


# (ledger connection, attempt row) -> the node of each rank
NodeOf = Callable[[sqlite3.Connection, sqlite3.Row], dict[int, str]]
# (ledger connection, attempt row) -> each live rank's processes on this machine
ProcsOf = Callable[[sqlite3.Connection, sqlite3.Row], dict[int, RankProc]]


class AttemptScan:
    """Reads a live attempt's checkpoint directory and heartbeats for a compute adapter."""

    def __init__(self, store: FactStore, node_of: NodeOf, procs_of: ProcsOf | None = None
                 ) -> None:
        """``procs_of``: where the ranks' processes can be watched from here (None: nowhere)."""
        self.store = store
        self.node_of = node_of
        self.procs_of = procs_of
        self.ranks = RankWatch()  # per-rank progress: hangs and stragglers (rank_progress)
        self.procs = ProcWatch()  # the processes of programs that report no progress
        self._scanned: dict[tuple[str, int], float] = {}  # (job, attempt): last heartbeat read

    def scan(self, db: sqlite3.Connection, att: sqlite3.Row, now: float,
             codes: Mapping[int, int | None] | None = None) -> None:
        """``codes``: the ranks' exit codes where known; when all ended 0 or 75 (done, or
        saved and stopped) their checkpoints are complete (``ledger.report_checkpoints``)."""
        ledger = self.store.ledger(db)
        done = bool(codes) and all(c in GRACEFUL for c in (codes or {}).values())
        for fact in report_checkpoints(ledger, att["job_id"], att["attempt"],
                                       att["checkpoint_dir"], now, writers_done=done):
            self.store.queue(db, fact)
        ended = bool(codes) and all(c is not None for c in (codes or {}).values())
        if ended:  # what its ranks restored, before the attempt's record goes
            self.store.queue(db, report_restore(ledger, att["job_id"], att["attempt"],
                                                att["checkpoint_dir"], att["world_size"], now,
                                                ended=True))
        key = (att["job_id"], att["attempt"])
        if now - self._scanned.get(key, -TIER_SCAN_S) < TIER_SCAN_S:
            return  # the heartbeats are read at a bounded rate, not every poll
        self._scanned[key] = now
        for fact in report_tier_saves(ledger, att["job_id"], att["attempt"],
                                      att["checkpoint_dir"], att["world_size"], now):
            self.store.queue(db, fact)
        self.store.queue(db, report_first_step(ledger, att["job_id"], att["attempt"],
                                               att["checkpoint_dir"], now))
        self.store.queue(db, report_restore(ledger, att["job_id"], att["attempt"],
                                            att["checkpoint_dir"], att["world_size"], now))
        for health in self.ranks.scan(att["job_id"], att["attempt"], att["checkpoint_dir"],
                                      self.node_of(db, att), now):
            self.store.queue(db, health)
        if self.procs_of is not None and key not in self.ranks.attempts:
            # (a program reporting per-rank progress keeps its sharper per-step threshold)
            for health in self.procs.scan(att["job_id"], att["attempt"], self.procs_of(db, att),
                                          att["checkpoint_dir"], now):
                self.store.queue(db, health)

    def forget(self, job_id: str, attempt: int) -> None:
        """The attempt ended: its read time goes (the map holds live attempts only)."""
        self._scanned.pop((job_id, attempt), None)
        self.procs.forget(job_id, attempt)
