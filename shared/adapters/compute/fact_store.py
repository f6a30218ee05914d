"""The private sqlite state of a compute adapter (local processes, Slurm, Compute Engine).

Several CLI processes take turns driving the same machines, so what an adapter knows lives in
a file, and every fact it reports (a node is up, an attempt exited) is queued in the outbox
(``shared.adapters.outbox.SqliteFactOutbox``) in the same transaction that records it, then
emitted once, outside any transaction. The attempt/repair bookkeeping in that transaction is
the shared ledger (``SqliteLedger``).

``FactStore`` is held, not inherited: a backend builds one and hands it to each of its
collaborators, which share its connection, its lock and its outbox.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from shared.adapters.compute.ledger import CHECKPOINTS_SCHEMA, SqliteLedger
from shared.adapters.outbox import FACT_OUTBOX_SCHEMA, SqliteFactOutbox
from shared.adapters.private_files import private_file
from shared.adapters.sqlite_store import full_means_unavailable
from shared.domain.events import Event
from shared.ports import Clock, Emitter

STATE_SCHEMA = CHECKPOINTS_SCHEMA + FACT_OUTBOX_SCHEMA  # what every adapter's file has


class FactStore:
    """One adapter's state file (``path``), created with ``schema`` plus the shared tables,
    and its fact outbox. ``emit`` and ``clock`` are the adapter's."""

    def __init__(self, path: Path, schema: str, emit: Emitter, clock: Clock) -> None:
        self.path = path
        self.emit = emit
        self.clock = clock
        self.lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._outbox = SqliteFactOutbox(self.tx, emit, clock)
        with self.lock:
            self._connect().executescript("BEGIN IMMEDIATE;" + schema + STATE_SCHEMA + "COMMIT;")

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            private_file(Path(self.path))
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA busy_timeout = 30000")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.row_factory = sqlite3.Row
            self._db = db
        return self._db

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; BEGIN IMMEDIATE so processes taking turns never interleave."""
        with self.lock, full_means_unavailable(Path(self.path)):
            db = self._connect()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # a full disk has rolled it back already
                    db.execute("ROLLBACK")
                raise
            try:
                db.execute("COMMIT")
            except sqlite3.Error:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    @staticmethod
    def ledger(db: sqlite3.Connection) -> SqliteLedger:
        return SqliteLedger(db)

    @staticmethod
    def queue(db: sqlite3.Connection, event: Event | None) -> None:
        """Queue a fact in this transaction (None: the ledger said it was reported already)."""
        if event is not None:
            SqliteFactOutbox.queue(db, event)

    def drain(self) -> None:
        """Emit what the transactions queued, once each."""
        self._outbox.drain()

    def close(self) -> None:
        """Close the state file. Workers and jobs keep running: they outlive the adapter."""
        with self.lock:
            if self._db is not None:
                self._db.close()
                self._db = None
