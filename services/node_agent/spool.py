"""The agent's spool: every report is written here first, then sent in order, then deleted.

Why a spool: a report is the one signal that says a node is broken, and the bus (Pub/Sub, the
API) is sometimes out of reach. The agent appends each report to this sqlite file (WAL,
``synchronous=FULL``: a committed append survives a kill or a power cut) and only then tries
to send; ``flush`` sends the oldest first and deletes each report once its transport accepted
it, so an outage delays reports and a crash at any point loses none. A crash between "sent"
and "deleted" sends that one report again, with the same event id: the receivers dedupe by
(source, id) and, conditions being state, a repeat changes nothing.

Each report keeps its ORIGINAL observation time (and its event id) however late it is sent,
so the control plane sees how old it is: a report older than ``max_event_age_s`` is dropped
as stale, one observed before the node's last repair is recorded and never acted on.

Bounded, with a stated policy (counted in ``stats()``):

1. Coalesce: a run of identical reports (same node, same condition types, statuses and
   reasons) keeps its first report (when the state began) and its latest (last seen); the
   middle ones carry no new information and are replaced in place (``coalesced``).
2. When still over ``max_reports`` or ``max_bytes``: drop the oldest report with no problem
   condition (no status ``true``); only when every report holds a problem, drop the oldest
   one (``dropped``). Changes are never coalesced away; dropping is the last resort.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.domain.errors import ValidationError

SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, node_id TEXT NOT NULL,
    observed_at REAL NOT NULL, fingerprint TEXT NOT NULL, problem INTEGER NOT NULL,
    data TEXT NOT NULL, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
COUNTERS = ("spooled", "coalesced", "dropped", "sent")


@dataclass(frozen=True)
class SpooledReport:
    """One report as spooled: what every transport sends."""

    seq: int
    event_id: str
    node_id: str
    observed_at: float
    data: Mapping[str, Any]  # publish.report_data(...): node_id, observed_at, source, conditions


Send = Callable[[SpooledReport], None]
"""Deliver one report; raises when it was not accepted (the report stays spooled)."""


@dataclass(frozen=True)
class FlushResult:
    sent: int
    left: int
    error: str = ""


def fingerprint(data: Mapping[str, Any]) -> str:
    """Same node and the same (type, status, reason) of every condition: an identical report."""
    conds = sorted((str(c.get("type")), str(c.get("status")), str(c.get("reason")))
                   for c in data.get("conditions", ()))
    raw = json.dumps([data.get("node_id"), data.get("source"), conds], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


class Spool:
    """A bounded, crash-safe FIFO of reports in one sqlite file (one agent per file)."""

    def __init__(self, path: str | os.PathLike[str], *, max_reports: int = 10_000,
                 max_bytes: int = 16 * 1024 * 1024) -> None:
        if max_reports < 2:
            raise ValidationError("spool_max_reports", "must be at least 2")
        if max_bytes < 1024:
            raise ValidationError("spool_max_bytes", "must be at least 1024")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_reports = max_reports
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None,
                                   check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        os.chmod(self.path, 0o600)  # reports name the node's faults: not for every user

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def append(self, event_id: str, data: Mapping[str, Any]) -> None:
        """Spool one report (durable when this returns), coalescing and bounding as above."""
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        fp = fingerprint(data)
        problem = int(any(c.get("status") == "true" for c in data.get("conditions", ())))
        row = (event_id, str(data["node_id"]), float(data["observed_at"]), fp, problem, text,
               len(text))
        with self._tx() as db:
            last_two = db.execute("SELECT seq, fingerprint FROM reports ORDER BY seq DESC LIMIT 2"
                                  ).fetchall()
            if len(last_two) == 2 and all(r["fingerprint"] == fp for r in last_two):
                db.execute("UPDATE reports SET event_id=?, node_id=?, observed_at=?, fingerprint=?,"
                           " problem=?, data=?, size=? WHERE seq=?", (*row, last_two[0]["seq"]))
                self._count(db, "coalesced")
            else:
                db.execute("INSERT INTO reports (event_id, node_id, observed_at, fingerprint,"
                           " problem, data, size) VALUES (?,?,?,?,?,?,?)", row)
            self._count(db, "spooled")
            self._bound(db)

    def _bound(self, db: sqlite3.Connection) -> None:
        while True:
            count, size = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM reports"
                                     ).fetchone()
            if count <= 1 or (count <= self.max_reports and size <= self.max_bytes):
                return
            victim = db.execute("SELECT seq FROM reports WHERE problem = 0 ORDER BY seq LIMIT 1"
                                ).fetchone() or db.execute(
                "SELECT seq FROM reports ORDER BY seq LIMIT 1").fetchone()
            db.execute("DELETE FROM reports WHERE seq = ?", (victim["seq"],))
            self._count(db, "dropped")

    @staticmethod
    def _count(db: sqlite3.Connection, name: str, by: int = 1) -> None:
        db.execute("INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE"
                   " SET value = value + excluded.value", (name, by))

    def pending(self, limit: int | None = None) -> list[SpooledReport]:
        """The oldest reports first."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM reports ORDER BY seq LIMIT ?",
                                    (-1 if limit is None else limit,)).fetchall()
        return [SpooledReport(r["seq"], r["event_id"], r["node_id"], r["observed_at"],
                              json.loads(r["data"])) for r in rows]

    def flush(self, send: Send, *, max_reports: int = 1000,
              deadline_s: float | None = None) -> FlushResult:
        """Send the oldest reports in order; stop at the first one not accepted (order is
        kept: a later report never overtakes an earlier one)."""
        started = time.monotonic()
        sent = 0
        error = ""
        for report in self.pending(max_reports):
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                break
            try:
                send(report)
            except Exception as exc:  # any failure: keep it, try again next time
                error = f"{type(exc).__name__}: {exc}"[:300]
                break
            with self._tx() as db:
                db.execute("DELETE FROM reports WHERE seq = ?", (report.seq,))
                self._count(db, "sent")
            sent += 1
        return FlushResult(sent, len(self), error)

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM reports").fetchone()[0])

    def stats(self) -> dict[str, int]:
        with self._lock:
            values = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            count, size = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM reports").fetchone()
        return {**{name: int(values.get(name, 0)) for name in COUNTERS},
                "queued": int(count), "queued_bytes": int(size)}
