"""sqlite document store: the embedded default, shared by CLI processes that run in turn.

One table of JSON documents; a transaction is ``BEGIN IMMEDIATE`` so two processes never
interleave their read-modify-write cycles. Threads of one process (``mtc serve``: request
threads and the control loop) share one connection under one lock, held from a
transaction's begin to its end and around every statement outside one.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.adapters.private_files import private_file
from shared.domain.errors import StateError, StorageFull
from shared.ports import ReadOnlyWrite

# The field a lookup scoped to an owner compares (``get_if``), per collection: the API's
# records by parent, jobs by cluster. It is compared in an index, never in the document, so
# a document of another owner is not read, let alone parsed: it costs what an absent one
# does, and no timing tells a tenant that another has the id. A partial index serves only a
# query that names its collection as a literal, hence the literals and INDEXED BY.
OWNERS = {"api_resources": "parent", "operations": "parent", "registry_models": "parent",
          "jobs": "cluster_id"}


def _owner_indexes() -> str:
    where: dict[str, list[str]] = {}
    for collection, field in OWNERS.items():
        where.setdefault(field, []).append(f"collection = '{collection}'")
    return "".join(f"CREATE INDEX IF NOT EXISTS docs_by_{field} ON docs (collection, id, "
                   f"json_extract(data, '$.{field}')) WHERE {' OR '.join(terms)};\n"
                   for field, terms in where.items())


SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    collection TEXT NOT NULL,
    id TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (collection, id)
);
CREATE INDEX IF NOT EXISTS docs_by_time
    ON docs (collection, json_extract(data, '$.time'), json_extract(data, '$.seq'));
""" + _owner_indexes()
_OWNED_GET = {collection: f"SELECT data FROM docs INDEXED BY docs_by_{field} WHERE "
              f"collection = '{collection}' AND id = ? AND json_extract(data, '$.{field}') = ?"
              for collection, field in OWNERS.items()}


FULL_CODES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})


@contextlib.contextmanager
def full_means_unavailable(path: Path) -> Iterator[None]:
    """A write sqlite refuses for want of space becomes ``StorageFull`` naming ``path``'s
    directory (an API 503, a control-loop pass retried), not a raw OperationalError."""
    try:
        yield
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code in FULL_CODES or (code is not None and code & 0xFF in FULL_CODES) \
                or "disk is full" in str(exc):
            raise StorageFull(f"the state storage refused a write: {path} ({exc}); free "
                              f"space in {path.parent} and retry") from exc
        raise


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _where(equals: dict[str, Any]) -> tuple[str, list[Any]]:
    clauses, params = [], []
    for key, value in equals.items():
        if not key.replace("_", "").isalnum():
            raise ValueError(f"bad field name {key!r}")
        if value is None:
            clauses.append(f"json_extract(data, '$.{key}') IS NULL")
        else:
            clauses.append(f"json_extract(data, '$.{key}') = ?")
            params.append(int(value) if isinstance(value, bool) else value)
    return "".join(f" AND {c}" for c in clauses), params


class SqliteTransaction:
    """``BEGIN IMMEDIATE`` (the write lock up front: no deadlock between two upgrading
    readers); a read-only one is deferred: a WAL snapshot that never blocks another process's
    writer."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.RLock,
                 read_only: bool = False, path: Path = Path("state.db")) -> None:
        self._conn = conn
        self._path = path
        self._lock = lock
        self._read_only = read_only
        lock.acquire()
        try:
            conn.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
        except BaseException:
            lock.release()
            raise
        self._open = True

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT data FROM docs WHERE collection=? AND id=?", (collection, doc_id)
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def get_if(self, collection: str, doc_id: str, equals: dict[str, Any]
               ) -> dict[str, Any] | None:
        """The document if its fields ``equals`` match; a collection's owner field
        (``OWNERS``) alone is compared in its index, any other fields in the document."""
        owned = _OWNED_GET.get(collection)
        value = equals.get(OWNERS.get(collection, ""))
        if owned is not None and len(equals) == 1 and isinstance(value, str):
            row = self._conn.execute(owned, (doc_id, value)).fetchone()
            return None if row is None else json.loads(row[0])
        doc = self.get(collection, doc_id)
        if doc is None or any(doc.get(k) != v for k, v in equals.items()):
            return None
        return doc

    def query(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        where, params = _where(equals)
        rows = self._conn.execute(
            f"SELECT data FROM docs WHERE collection=?{where} ORDER BY id", [collection, *params]
        ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def put(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        if self._read_only:
            raise ReadOnlyWrite(f"put {collection}/{doc_id} in a read-only transaction")
        with full_means_unavailable(self._path):
            self._conn.execute(
                "INSERT OR REPLACE INTO docs (collection, id, data) VALUES (?, ?, ?)",
                (collection, doc_id, _dumps(doc)),
            )

    def delete(self, collection: str, doc_id: str) -> None:
        if self._read_only:
            raise ReadOnlyWrite(f"delete {collection}/{doc_id} in a read-only transaction")
        with full_means_unavailable(self._path):
            self._conn.execute("DELETE FROM docs WHERE collection=? AND id=?",
                               (collection, doc_id))

    def commit(self) -> None:
        try:
            with full_means_unavailable(self._path):
                self._conn.execute("COMMIT")
        except StorageFull:
            self._abandon()
            raise
        finally:
            self._release()

    def rollback(self) -> None:
        try:
            self._abandon()
        finally:
            self._release()

    def _abandon(self) -> None:
        """Roll back what is open (sqlite may have rolled back itself: a full disk does)."""
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _release(self) -> None:
        if self._open:
            self._open = False
            self._lock.release()


class SqliteDocStore:
    """A ``DocStore`` with ``Pruning`` and ``RangeReads`` (``shared.ports``)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path = private_file(path)
            self._conn = sqlite3.connect(path, timeout=30.0, isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open the state database {path}: {exc} (the directory "
                             f"{path.parent} must be writable by this user, and the file a "
                             "sqlite database)") from exc
        self._lock = threading.RLock()

    def begin(self, *, read_only: bool = False) -> SqliteTransaction:
        return SqliteTransaction(self._conn, self._lock, read_only, self.path)

    def read(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        where, params = _where(equals)
        with self._lock:
            rows = self._conn.execute(
                f"SELECT data FROM docs WHERE collection=?{where} ORDER BY id",
                [collection, *params],
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def write(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        with self._lock, full_means_unavailable(self.path):
            self._conn.execute(
                "INSERT OR REPLACE INTO docs (collection, id, data) VALUES (?, ?, ?)",
                (collection, doc_id, _dumps(doc)),
            )

    def remove(self, collection: str, doc_id: str) -> None:
        with self._lock, full_means_unavailable(self.path):
            self._conn.execute("DELETE FROM docs WHERE collection=? AND id=?",
                               (collection, doc_id))

    def oldest(self, collection: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT data FROM docs WHERE collection=? ORDER BY json_extract(data, '$.time'),"
                " json_extract(data, '$.seq') LIMIT ?", (collection, limit),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def since(self, collection: str, time: float) -> list[dict[str, Any]]:
        """Documents with ``time >= time`` in (time, seq) order, from the time index: an
        incremental reader (the event log's follower) never reads the whole collection."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT data FROM docs WHERE collection=? AND json_extract(data, '$.time') >= ?"
                " ORDER BY json_extract(data, '$.time'), json_extract(data, '$.seq')",
                (collection, time),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def prune(self, collection: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` documents whose ``time`` is older than ``before`` (the
        retention horizon), oldest first, through the time index."""
        with self._lock:
            cur = self._conn.execute(
                "DELETE FROM docs WHERE collection=? AND id IN (SELECT id FROM docs WHERE"
                " collection=? AND json_extract(data, '$.time') < ?"
                " ORDER BY json_extract(data, '$.time') LIMIT ?)",
                (collection, collection, before, limit),
            )
        return cur.rowcount

    def close(self) -> None:
        with self._lock:  # not under another thread's statement or transaction
            self._conn.close()
