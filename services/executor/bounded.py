"""A bounded sqlite table in the executor's state directory, shared by its records.

WAL and synchronous FULL, so a row written before a crash is there after it; one lock, so
the executor's threads share the connection; ``trim`` keeps at most ``max_records`` rows,
the oldest by ``order`` going first.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


class BoundedTable:
    """``table`` of ``<state_dir>/<file>`` (created by ``schema``), keyed by ``key``. The
    names are the records' own constants, never a caller's input: they are written into SQL."""

    def __init__(self, state_dir: Path, file: str, schema: str, *, table: str, key: str,
                 order: str, max_records: int) -> None:
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(state_dir) / file
        self.table, self.key, self.order = table, key, order
        self.max_records = max_records
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(schema)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, params).fetchall())

    def change(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the rows it changed."""
        with self._lock:
            return int(self._db.execute(sql, params).rowcount)

    def change_many(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        with self._lock:
            self._db.executemany(sql, params)

    def trim(self) -> int:
        """Drop the oldest rows beyond ``max_records``; how many went."""
        with self._lock:
            count = self._count()
            if count <= self.max_records:
                return 0
            return int(self._db.execute(
                f"DELETE FROM {self.table} WHERE {self.key} IN (SELECT {self.key} FROM"
                f" {self.table} ORDER BY {self.order} LIMIT ?)",
                (count - self.max_records,)).rowcount)

    def _count(self) -> int:
        return int(self._db.execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0])

    def __len__(self) -> int:
        with self._lock:
            return self._count()

    def close(self) -> None:
        with self._lock:
            self._db.close()
