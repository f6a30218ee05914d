"""sqlite document store: the embedded default, shared by CLI processes that run in turn.

One table of JSON documents; a transaction is ``BEGIN IMMEDIATE`` so two processes never
interleave their read-modify-write cycles. Threads of one process (``mtc serve``: request
threads and the control loop) share one writing connection under one lock, held from a
transaction's begin to its end and around every write outside one. Reads never take it:
each thread reads through a connection of its own (a read-only transaction is a WAL
snapshot), so an API GET never waits for the control loop's commit, nor the loop for a GET.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.adapters.private_files import private_file
from shared.domain.errors import StateError, StorageFull
from shared.ports import PageKey, ReadOnlyWrite

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
CREATE INDEX IF NOT EXISTS docs_by_state
    ON docs (collection, json_extract(data, '$.state'), id);
CREATE INDEX IF NOT EXISTS docs_by_listing
    ON docs (collection, json_extract(data, '$.kind'), json_extract(data, '$.parent'),
             json_extract(data, '$.created'), id);
""" + _owner_indexes()
_OWNED_GET = {collection: f"SELECT data FROM docs INDEXED BY docs_by_{field} WHERE "
              f"collection = '{collection}' AND id = ? AND json_extract(data, '$.{field}') = ?"
              for collection, field in OWNERS.items()}
# docs_by_state: which jobs (or nodes) are in a state, keys only (a list filtered by state);
# docs_by_listing: a page of the API's records of one kind under one parent, in list order


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


def _field(key: str) -> str:
    if not key.replace("_", "").isalnum():
        raise ValueError(f"bad field name {key!r}")
    return f"json_extract(data, '$.{key}')"


def _where(equals: dict[str, Any]) -> tuple[str, list[Any]]:
    clauses, params = [], []
    for key, value in equals.items():
        field = _field(key)
        if value is None:
            clauses.append(f"{field} IS NULL")
        else:
            clauses.append(f"{field} = ?")
            params.append(int(value) if isinstance(value, bool) else value)
    return "".join(f" AND {c}" for c in clauses), params


class SqliteTransaction:
    """``BEGIN IMMEDIATE`` (the write lock up front: no deadlock between two upgrading
    readers); a read-only one is deferred, on the thread's reading connection: a WAL snapshot
    that takes no lock, neither this process's nor another's. A ``KeyedTransaction``:
    keys-only queries read an index, not the documents."""

    def __init__(self, conn: sqlite3.Connection, lock: threading.RLock | None,
                 read_only: bool = False, path: Path = Path("state.db"),
                 store: SqliteDocStore | None = None) -> None:
        self._conn = conn
        self._path = path
        self._lock = lock
        self._read_only = read_only
        self._store = store
        if lock is not None:
            lock.acquire()
        try:
            conn.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        if store is not None and not read_only:
            store._writer = threading.get_ident()
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

    def ids(self, collection: str, equals: dict[str, Any]) -> set[str]:
        """The ids of the documents ``query`` would return, from an index where one covers
        ``equals`` (``docs_by_state``): no document is read or decoded."""
        where, params = _where(equals)
        rows = self._conn.execute(f"SELECT id FROM docs WHERE collection=?{where}",
                                  [collection, *params]).fetchall()
        return {r[0] for r in rows}

    def page(self, collection: str, equals: dict[str, Any], order: str, *,
             after: PageKey | None = None, limit: int) -> list[tuple[str, dict[str, Any]]]:
        """One page in (``order``, id) order: a range of ``docs_by_listing`` when ``equals``
        is (kind, parent) and ``order`` is ``created``, so only the page's rows are read."""
        where, params = _where(equals)
        key = _field(order)
        if after is not None:  # (key, id) > after, spelled so that the index seeks to it
            where += f" AND {key} >= ? AND ({key} > ? OR id > ?)"
            params += [after[0], after[0], after[1]]
        rows = self._conn.execute(
            f"SELECT id, data FROM docs WHERE collection=?{where} ORDER BY {key}, id LIMIT ?",
            [collection, *params, limit]).fetchall()
        return [(r[0], json.loads(r[1])) for r in rows]

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
            if self._store is not None and not self._read_only:
                self._store._writer = None
            if self._lock is not None:
                self._lock.release()


class _Reader:
    """A thread's reading connection; closed when the thread (its only holder) ends."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=30.0, isolation_level=None,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA query_only=ON")

    def __del__(self) -> None:
        self.conn.close()


class SqliteDocStore:
    """A ``DocStore`` with ``KeyQueries``, ``Pruning`` and ``RangeReads`` (``shared.ports``)."""

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
        self._writer: int | None = None  # the thread inside a write transaction, if any
        self._local = threading.local()
        self._readers: weakref.WeakSet[_Reader] = weakref.WeakSet()
        self._readers_lock = threading.Lock()
        self._closed = False

    def _reading(self) -> sqlite3.Connection | None:
        """The calling thread's reading connection; None inside its own write transaction
        (whose uncommitted writes only the writing connection sees)."""
        if self._writer == threading.get_ident():
            return None
        reader: _Reader | None = getattr(self._local, "reader", None)
        if reader is None:
            with self._readers_lock:
                if self._closed:
                    raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
                reader = self._local.reader = _Reader(self.path)
                self._readers.add(reader)
        return reader.conn

    def begin(self, *, read_only: bool = False) -> SqliteTransaction:
        reader = self._reading() if read_only else None
        if reader is not None:
            return SqliteTransaction(reader, None, True, self.path)
        return SqliteTransaction(self._conn, self._lock, read_only, self.path, self)

    def begin_keyed(self, *, read_only: bool = False) -> SqliteTransaction:
        """``begin``, as the ``KeyQueries`` store it is (``shared.ports``)."""
        return self.begin(read_only=read_only)

    @contextlib.contextmanager
    def _reads(self) -> Iterator[sqlite3.Connection]:
        """A connection for a read outside any transaction: the thread's own, or the
        writing one (under its lock) inside this thread's write transaction."""
        reader = self._reading()
        if reader is not None:
            yield reader
            return
        with self._lock:
            yield self._conn

    def read(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        where, params = _where(equals)
        with self._reads() as conn:
            rows = conn.execute(
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
        with self._reads() as conn:
            rows = conn.execute(
                "SELECT data FROM docs WHERE collection=? ORDER BY json_extract(data, '$.time'),"
                " json_extract(data, '$.seq') LIMIT ?", (collection, limit),
            ).fetchall()
        return [json.loads(r[0]) for r in rows]

    def since(self, collection: str, time: float) -> list[dict[str, Any]]:
        """Documents with ``time >= time`` in (time, seq) order, from the time index: an
        incremental reader (the event log's follower) never reads the whole collection."""
        with self._reads() as conn:
            rows = conn.execute(
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
        with self._lock, self._readers_lock:  # not under another thread's write
            self._closed = True
            for reader in list(self._readers):
                reader.conn.close()
            self._conn.close()
