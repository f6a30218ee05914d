"""The executor's record of what it did with each request: exactly once per request id.

A sqlite file in the executor's state directory (WAL, synchronous FULL), so it survives a
restart. It is bounded: a request's record is needed only until its deadline has passed
(after that a redelivery is refused by its deadline anyway), so records are pruned
``margin_s`` past their deadline, and never more than ``max_records`` are kept (the oldest
go first).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    request_id TEXT PRIMARY KEY, op TEXT NOT NULL, outcome TEXT NOT NULL,
    deadline REAL NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS requests_deadline ON requests (deadline);
CREATE INDEX IF NOT EXISTS requests_at ON requests (at);
"""


class DedupRecord:
    """``seen``/``record``/``prune`` over ``<state_dir>/executor.sqlite3``."""

    FILE = "executor.sqlite3"

    def __init__(self, state_dir: Path, *, margin_s: float = 3600.0,
                 max_records: int = 100_000) -> None:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(state_dir) / self.FILE
        self.margin_s = margin_s
        self.max_records = max_records
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def seen(self, request_id: str) -> str | None:
        """The outcome recorded for the request, or None if it is new."""
        with self._lock:
            row = self._db.execute("SELECT outcome FROM requests WHERE request_id = ?",
                                   (request_id,)).fetchone()
        return None if row is None else str(row[0])

    def record(self, request_id: str, op: str, outcome: str, deadline: float, now: float
               ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO requests (request_id, op, outcome, deadline, at)"
                " VALUES (?, ?, ?, ?, ?)", (request_id, op, outcome, deadline, now))

    def prune(self, now: float) -> int:
        """Drop what no redelivery can need any more; returns how many."""
        with self._lock:
            gone = self._db.execute("DELETE FROM requests WHERE deadline < ?",
                                    (now - self.margin_s,)).rowcount
            count = self._db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
            if count > self.max_records:
                gone += self._db.execute(
                    "DELETE FROM requests WHERE request_id IN (SELECT request_id FROM requests"
                    " ORDER BY at LIMIT ?)", (count - self.max_records,)).rowcount
        return int(gone)

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM requests").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
