"""The private sqlite state of a compute adapter (local processes, Slurm).

Several CLI processes take turns driving the same machines, so what an adapter knows lives in
a file, and every fact it reports (a node is up, an attempt exited) is queued in an outbox in
the same transaction that records it, then emitted once, outside any transaction.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

from shared.domain.events import Event, event_class
from shared.ports import Clock

OUTBOX_LEASE_S = 30.0  # a claimed event not emitted by then (its poller died) is emitted again
OUTBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL, data TEXT NOT NULL,
    claimed_at REAL);
"""


class FactState:
    """Mixin: subclasses set ``state_dir``, ``_lock``, ``_db``, ``_emit`` and ``_clock``."""

    DB_FILE: ClassVar[str]
    state_dir: Path
    _lock: threading.Lock | threading.RLock
    _db: sqlite3.Connection | None
    _emit: Callable[[Event], None]
    _clock: Clock

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self.state_dir / self.DB_FILE, timeout=30.0,
                                 isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA busy_timeout = 30000")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.row_factory = sqlite3.Row
            self._db = db
        return self._db

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE so processes taking turns never interleave."""
        with self._lock:
            db = self._connect()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _queue(db: sqlite3.Connection, event: Event) -> None:
        db.execute("INSERT INTO outbox (type, data) VALUES (?, ?)",
                   (event.TYPE, json.dumps(event.to_dict())))

    def _drain(self) -> None:
        """Emit queued facts in order, outside any transaction; delete each once emitted."""
        while True:
            now = self._clock.now()
            with self._tx() as db:
                row = db.execute(
                    "SELECT id, type, data FROM outbox WHERE claimed_at IS NULL OR claimed_at <= ?"
                    " ORDER BY id LIMIT 1",
                    (now - OUTBOX_LEASE_S,),
                ).fetchone()
                if row is not None:
                    db.execute("UPDATE outbox SET claimed_at = ? WHERE id = ?", (now, row["id"]))
            if row is None:
                return
            event = event_class(row["type"]).from_dict(json.loads(row["data"]))
            try:
                self._emit(event)
            except BaseException:
                with self._tx() as db:
                    db.execute("UPDATE outbox SET claimed_at = NULL WHERE id = ?", (row["id"],))
                raise
            with self._tx() as db:
                db.execute("DELETE FROM outbox WHERE id = ?", (row["id"],))

    def close(self) -> None:
        """Close the state file. Workers and jobs keep running: they outlive this object."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
