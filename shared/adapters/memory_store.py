"""In-memory document store: the simulator's and the unit tests' backend.

Transactions are serialized by one lock and buffer their writes, so a rollback leaves
nothing behind, as in the real stores.

Equality queries use indexes, as Firestore's single-field indexes do: the first query on a
field of a collection builds an index of it (value -> document ids), which every write then
keeps up to date, so a query reads the documents that match instead of the whole
collection (scheduling's "idle nodes of this cluster" no longer scans every node). Results
keep the order a scan gives (the order the documents were first written).
"""

from __future__ import annotations

import copy
import heapq
import sys
import threading
from collections import defaultdict
from collections.abc import Set as AbstractSet
from typing import Any

from shared.ports import PageKey, ReadOnlyWrite

_DELETED = object()
_EMPTY: frozenset[str] = frozenset()
_UNHASHABLE = object()  # the index bucket of values a dict cannot key (lists, dicts)
SCAN_FRACTION = 0.5  # an index that narrows a query to more than this is not worth using


def _matches(doc: dict[str, Any], items: Any) -> bool:
    return all(doc.get(k) == v for k, v in items)


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _key(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    try:
        hash(value)
    except TypeError:
        return _UNHASHABLE
    return value


def _leave(index: dict[Any, set[str]], key: Any, doc_id: str) -> None:
    """``doc_id`` out of ``index[key]``; a bucket left mostly empty is rebuilt. A Python set
    never shrinks on removal, and an intersection walks the whole table: the idle bucket of
    a 16,640-node fleet, down to 212 ids once its nodes were allocated, still walked the
    table sized for 16,640. A rebuild copies what is left, at most once per as many
    removals: amortized O(1)."""
    bucket = index[key]
    bucket.discard(doc_id)
    if sys.getsizeof(bucket) > _SPARSE_BYTES + _SPARSE_PER_ID * len(bucket):
        index[key] = set(bucket)


_SPARSE_BYTES, _SPARSE_PER_ID = 4096, 128  # a table over this (bytes) is rebuilt


class MemoryTransaction:
    """An ``IndexedTransaction``: documents come back with the values written (no JSON in
    between), keys-only queries and projections from the indexes."""

    def __init__(self, store: MemoryDocStore, read_only: bool = False) -> None:
        self._store = store
        self._writes: dict[tuple[str, str], Any] = {}
        self._read_only = read_only
        store.lock.acquire()
        self._open = True

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        doc = self.peek(collection, doc_id)
        return None if doc is None else dict(doc)

    def get_if(self, collection: str, doc_id: str, equals: dict[str, Any]
               ) -> dict[str, Any] | None:
        """``get`` if the document's fields ``equals`` match (compared before the copy)."""
        doc = self.peek(collection, doc_id)
        return None if doc is None or not _matches(doc, equals.items()) else dict(doc)

    def peek(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        """``get`` without the copy, for a reader that never changes what it is given (the
        unit of work decoding an entity: its writes are new documents, put at commit)."""
        pending = self._writes.get((collection, doc_id))
        if pending is _DELETED:
            return None
        if pending is not None:
            return pending  # type: ignore[no-any-return]
        return self._store.data[collection].get(doc_id)

    def query(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        return [dict(d) for _, d in self._store.matching(collection, equals)]

    def page(self, collection: str, equals: dict[str, Any], order: str, *,
             after: PageKey | None = None, limit: int) -> list[tuple[str, dict[str, Any]]]:
        """One page in (``order``, id) order: the matches come from the indexes, and only
        the page's documents are sorted out of them and copied."""
        hits = self._store.matching(collection, equals)
        if after is not None:
            hits = [(i, d) for i, d in hits if (d.get(order), i) > after]
        chosen = heapq.nsmallest(limit, hits, key=lambda hit: (hit[1].get(order), hit[0]))
        return [(i, dict(d)) for i, d in chosen]

    def ids(self, collection: str, equals: dict[str, Any]) -> AbstractSet[str]:
        """The ids of the documents ``query`` would return (a keys-only query), to read
        while the transaction lasts (maybe an index's own bucket: a restart asks for the
        2,048 sound nodes of a job twice, and copying them cost as much as the question)."""
        return self._store.matching_ids(collection, equals)

    def project(self, collection: str, equals: dict[str, Any], fields: tuple[str, ...]
                ) -> list[tuple[str, tuple[Any, ...]]]:
        """(id, the values of ``fields``) of the documents ``query`` would return, in its
        order, without copying them (a projection: Firestore's ``select``)."""
        return [(i, tuple(map(d.get, fields))) for i, d in self._store.matching(collection,
                                                                                 equals)]

    def put(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        if self._read_only:
            raise ReadOnlyWrite(f"put {collection}/{doc_id} in a read-only transaction")
        self._writes[(collection, doc_id)] = doc

    def delete(self, collection: str, doc_id: str) -> None:
        if self._read_only:
            raise ReadOnlyWrite(f"delete {collection}/{doc_id} in a read-only transaction")
        self._writes[(collection, doc_id)] = _DELETED

    def commit(self) -> None:
        try:
            store = self._store
            for (collection, doc_id), doc in self._writes.items():
                if doc is _DELETED:
                    store.discard(collection, doc_id)
                else:
                    store.store(collection, doc_id, doc)
        finally:
            self._release()

    def rollback(self) -> None:
        self._writes.clear()
        self._release()

    def _release(self) -> None:
        if self._open:
            self._open = False
            self._store.lock.release()


class MemoryDocStore:
    """A ``DocStore`` with ``IndexedQueries``, ``Pruning`` and ``RangeReads``."""

    def __init__(self) -> None:
        self.data: defaultdict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.lock = threading.RLock()
        # collection -> field -> value -> ids; only fields something has queried
        self._indexes: dict[str, dict[str, dict[Any, set[str]]]] = {}
        # collection -> id -> when first written (a scan's order), for indexed collections
        self._order: dict[str, dict[str, int]] = {}
        self._written = 0
        # collections whose documents were each written once, in time order (the event log,
        # the idempotency records): their dict order is time order, so a prune stops at the
        # first document young enough instead of scanning them all; a write out of order
        # (older, untimed, or a rewrite) moves the collection to ``_unordered`` for good
        self._last_time: dict[str, float] = {}
        self._unordered: set[str] = set()

    def begin(self, *, read_only: bool = False) -> MemoryTransaction:
        return MemoryTransaction(self, read_only)

    def begin_indexed(self, *, read_only: bool = False) -> MemoryTransaction:
        """``begin``, as the ``IndexedQueries`` store it is (``shared.ports``)."""
        return MemoryTransaction(self, read_only)

    # -- writes keep the indexes (every write to ``data`` goes through these two)
    def store(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        docs = self.data[collection]
        indexes = self._indexes.get(collection)
        if indexes is not None:
            old = docs.get(doc_id)
            if old is None:
                self._written += 1
                self._order[collection][doc_id] = self._written
            for name, index in indexes.items():
                value = doc.get(name)
                if old is not None:
                    was = old.get(name)
                    if was is value or (type(was) is type(value) and was == value):
                        continue  # the same value (most writes change no indexed field)
                    old_key, new_key = _key(was), _key(value)
                    if old_key is new_key or old_key == new_key:
                        continue
                    _leave(index, old_key, doc_id)
                else:
                    new_key = _key(value)
                index.setdefault(new_key, set()).add(doc_id)
        if collection not in self._unordered:
            at = doc.get("time")
            if (type(at) is float or type(at) is int) and doc_id not in docs \
                    and at >= self._last_time.get(collection, at):
                self._last_time[collection] = at
            else:
                self._unordered.add(collection)
        docs[doc_id] = doc

    def discard(self, collection: str, doc_id: str) -> None:
        old = self.data[collection].pop(doc_id, None)
        indexes = self._indexes.get(collection)
        if old is None or indexes is None:
            return
        del self._order[collection][doc_id]
        for name, index in indexes.items():
            _leave(index, _key(old.get(name)), doc_id)

    # -- queries
    def _candidates(self, collection: str, equals: dict[str, Any]
                    ) -> tuple[set[str] | frozenset[str] | None, bool]:
        """The ids the indexes allow for ``equals`` (None: no field to index; maybe an
        index's own bucket, not to be changed), and whether they are exact (False: some
        documents hold values an index cannot key, so the candidates still have to be
        checked)."""
        buckets: list[set[str] | frozenset[str]] = []
        exact = True
        every = len(self.data[collection])
        for name, value in equals.items():
            key = _key(value)
            if key is _UNHASHABLE:
                exact = False
                continue
            index = self._index(collection, name)
            found = index.get(key, _EMPTY)
            unhashable = index.get(_UNHASHABLE)
            if unhashable:
                found = found | unhashable
                exact = False
            buckets.append(found)
        if not buckets:
            return None, False
        # a bucket holding every document narrows nothing (a fleet's one cluster_id)
        buckets = [b for b in buckets if len(b) != every] or buckets[:1]
        buckets.sort(key=len)
        first, *rest = buckets
        if rest:
            return first.intersection(*rest), exact
        return first, exact

    def matching(self, collection: str, equals: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """(id, document) of every document whose fields equal ``equals``, in scan order."""
        docs = self.data[collection]
        items = equals.items()
        found, exact = self._candidates(collection, equals)
        if found is None:
            return [(i, d) for i, d in docs.items() if _matches(d, items)]
        if len(found) > SCAN_FRACTION * len(docs):  # most documents: a scan keeps the order
            if exact:
                return [(i, d) for i, d in docs.items() if i in found]
            return [(i, d) for i, d in docs.items() if i in found and _matches(d, items)]
        order = self._order[collection]
        hits = [(i, docs[i]) for i in sorted(found, key=order.__getitem__)]
        return hits if exact else [(i, d) for i, d in hits if _matches(d, items)]

    def matching_ids(self, collection: str, equals: dict[str, Any]) -> AbstractSet[str]:
        """The ids of the documents ``matching`` returns, from the indexes alone: maybe an
        index's own bucket, which the caller must not change."""
        found, exact = self._candidates(collection, equals)
        if found is not None and exact:
            return found
        return {i for i, _ in self.matching(collection, equals)}

    def _index(self, collection: str, name: str) -> dict[Any, set[str]]:
        indexes = self._indexes.setdefault(collection, {})
        index = indexes.get(name)
        if index is None:
            docs = self.data[collection]
            if collection not in self._order:
                order = self._order[collection] = {}
                for doc_id in docs:
                    self._written += 1
                    order[doc_id] = self._written
            index = indexes[name] = {}
            for doc_id, doc in docs.items():
                index.setdefault(_key(doc.get(name)), set()).add(doc_id)
        return index

    def read(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(d) for _, d in self.matching(collection, equals)]

    def write(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        with self.lock:
            self.store(collection, doc_id, doc)

    def remove(self, collection: str, doc_id: str) -> None:
        with self.lock:
            self.discard(collection, doc_id)

    def oldest(self, collection: str, limit: int) -> list[dict[str, Any]]:
        with self.lock:
            docs = heapq.nsmallest(limit, self.data[collection].values(),
                                   key=lambda d: (d["time"], d.get("seq", 0)))
            return [copy.deepcopy(d) for d in docs]

    def since(self, collection: str, time: float) -> list[dict[str, Any]]:
        """Documents with ``time >= time`` in (time, seq) order."""
        with self.lock:
            docs = [d for d in self.data[collection].values() if d.get("time", 0.0) >= time]
            docs.sort(key=lambda d: (d["time"], d.get("seq", 0)))
            return [copy.deepcopy(d) for d in docs]

    def prune(self, collection: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` documents whose ``time`` is older than ``before``."""
        with self.lock:
            docs = self.data[collection]
            if collection not in self._unordered:  # time order: the oldest come first
                old: list[str] = []
                for k, d in docs.items():
                    if len(old) >= limit or d["time"] >= before:
                        break
                    old.append(k)
            else:
                old = heapq.nsmallest(limit, (k for k, d in docs.items()
                                              if d.get("time", 0.0) < before),
                                      key=lambda k: docs[k]["time"])
            for key in old:
                self.discard(collection, key)
            return len(old)

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        """A deep copy of everything except bookkeeping, for convergence tests."""
        with self.lock:
            return {k: copy.deepcopy(v) for k, v in self.data.items()}
