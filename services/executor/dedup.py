"""The executor's record of what it did with each request: exactly once per request id.

A sqlite file in the executor's state directory (WAL, synchronous FULL), so it survives a
restart. It is bounded: a request's record is needed only until its deadline has passed
(after that a redelivery is refused by its deadline anyway), so records are pruned
``margin_s`` past their deadline, and never more than ``max_records`` are kept (the oldest
go first).
"""

from __future__ import annotations

from pathlib import Path

from services.executor.bounded import BoundedTable

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
        self._t = BoundedTable(state_dir, self.FILE, _SCHEMA, table="requests",
                               key="request_id", order="at", max_records=max_records)
        self.path = self._t.path
        self.margin_s = margin_s
        self.max_records = max_records

    def seen(self, request_id: str) -> str | None:
        """The outcome recorded for the request, or None if it is new."""
        rows = self._t.rows("SELECT outcome FROM requests WHERE request_id = ?", (request_id,))
        return str(rows[0][0]) if rows else None

    def record(self, request_id: str, op: str, outcome: str, deadline: float, now: float
               ) -> None:
        self._t.change("INSERT OR REPLACE INTO requests (request_id, op, outcome, deadline, at)"
                       " VALUES (?, ?, ?, ?, ?)", (request_id, op, outcome, deadline, now))

    def prune(self, now: float) -> int:
        """Drop what no redelivery can need any more; returns how many."""
        gone = self._t.change("DELETE FROM requests WHERE deadline < ?", (now - self.margin_s,))
        return gone + self._t.trim()

    def __len__(self) -> int:
        return len(self._t)

    def close(self) -> None:
        self._t.close()
