"""In-memory document store: the simulator's and the unit tests' backend.

Transactions are serialized by one lock and buffer their writes, so a rollback leaves
nothing behind, as in the real stores.
"""

from __future__ import annotations

import copy
import heapq
import threading
from collections import defaultdict
from typing import Any

_DELETED = object()


class MemoryTransaction:
    def __init__(self, store: MemoryDocStore) -> None:
        self._store = store
        self._writes: dict[tuple[str, str], Any] = {}
        store.lock.acquire()
        self._open = True

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        pending = self._writes.get((collection, doc_id))
        if pending is _DELETED:
            return None
        if pending is not None:
            return dict(pending)
        doc = self._store.data[collection].get(doc_id)
        return None if doc is None else dict(doc)

    def query(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        docs = self._store.data[collection]
        items = equals.items()
        return [dict(d) for d in docs.values() if all(d.get(k) == v for k, v in items)]

    def put(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        self._writes[(collection, doc_id)] = doc

    def delete(self, collection: str, doc_id: str) -> None:
        self._writes[(collection, doc_id)] = _DELETED

    def commit(self) -> None:
        try:
            for (collection, doc_id), doc in self._writes.items():
                if doc is _DELETED:
                    self._store.data[collection].pop(doc_id, None)
                else:
                    self._store.data[collection][doc_id] = doc
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
    def __init__(self) -> None:
        self.data: defaultdict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        self.lock = threading.RLock()

    def begin(self) -> MemoryTransaction:
        return MemoryTransaction(self)

    def read(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(d) for d in self.data[collection].values()
                    if all(d.get(k) == v for k, v in equals.items())]

    def write(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        with self.lock:
            self.data[collection][doc_id] = doc

    def remove(self, collection: str, doc_id: str) -> None:
        with self.lock:
            self.data[collection].pop(doc_id, None)

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
            old = heapq.nsmallest(limit, (k for k, d in docs.items()
                                          if d.get("time", 0.0) < before),
                                  key=lambda k: docs[k]["time"])
            for key in old:
                del docs[key]
            return len(old)

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        """A deep copy of everything except bookkeeping, for convergence tests."""
        with self.lock:
            return {k: copy.deepcopy(v) for k, v in self.data.items()}
