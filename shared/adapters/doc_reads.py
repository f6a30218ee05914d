"""How a unit of work reads its store: chosen once, when the unit of work is built, from the
capabilities the store declares (``shared.ports``), never probed per call.

A plain :class:`~shared.ports.DocStore` (sqlite, Firestore) answers every read with copies of
whole documents that went through JSON, a :class:`~shared.ports.KeyQueries` one (sqlite)
keys-only queries from its indexes; an :class:`~shared.ports.IndexedQueries` store (the
memory store) answers keys-only queries and projections from its indexes, hands documents
over uncopied and keeps the values written.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from shared.ports import (
    DocStore,
    DocTransaction,
    IndexedQueries,
    IndexedTransaction,
    KeyedTransaction,
    KeyQueries,
)

DocKey = Callable[[dict[str, Any]], str]  # a stored document's id, read without decoding it


class Reads(Protocol):
    """A unit of work's reads through its store's open transaction."""

    # documents come back with the values written (tuples as tuples), so what was loaded is
    # what a commit compares an entity's encoding with; else (JSON) the entity's encoding
    # as it was loaded is
    keeps_values: bool
    any_ids: bool  # any string is a document id (else an idempotency key is hashed)

    def begin(self, read_only: bool) -> DocTransaction: ...
    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        """A document to decode, never to change."""
        ...
    def get_if(self, collection: str, doc_id: str, equals: dict[str, Any]
               ) -> dict[str, Any] | None:
        """``get`` if the document's fields ``equals`` match (``DocTransaction.get_if``)."""
        ...
    def ids(self, collection: str, equals: dict[str, Any], doc_key: DocKey) -> AbstractSet[str]:
        """The ids of the matching documents; read-only."""
        ...
    def project(self, collection: str, equals: dict[str, Any], fields: tuple[str, ...],
                doc_key: DocKey) -> list[tuple[str, tuple[Any, ...]]]:
        """(id, the values of ``fields``) of the matching documents, in the query's order."""
        ...


class _Closed:
    """The transaction of a unit of work outside ``with``: every read is a bug."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("unit of work used outside 'with'")


_CLOSED: Any = _Closed()


class StoreReads:
    """Reads of a plain document store: whole documents, through JSON."""

    keeps_values = False
    any_ids = False

    def __init__(self, store: DocStore) -> None:
        self._store = store
        self._txn: DocTransaction = _CLOSED

    def begin(self, read_only: bool) -> DocTransaction:
        self._txn = txn = self._store.begin(read_only=read_only)
        return txn

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        return self._txn.get(collection, doc_id)

    def get_if(self, collection: str, doc_id: str, equals: dict[str, Any]
               ) -> dict[str, Any] | None:
        return self._txn.get_if(collection, doc_id, equals)

    def ids(self, collection: str, equals: dict[str, Any], doc_key: DocKey) -> AbstractSet[str]:
        return set(map(doc_key, self._txn.query(collection, equals)))

    def project(self, collection: str, equals: dict[str, Any], fields: tuple[str, ...],
                doc_key: DocKey) -> list[tuple[str, tuple[Any, ...]]]:
        return [(doc_key(doc), tuple(map(doc.get, fields)))
                for doc in self._txn.query(collection, equals)]


class KeyedStoreReads(StoreReads):
    """Reads of a plain document store that answers keys-only queries from its indexes."""

    def __init__(self, store: KeyQueries) -> None:  # (no super: ``begin`` is its own)
        self._keyed = store
        self._txn = _CLOSED
        self._txn_keyed: KeyedTransaction = _CLOSED

    def begin(self, read_only: bool) -> DocTransaction:
        self._txn = self._txn_keyed = self._keyed.begin_keyed(read_only=read_only)
        return self._txn_keyed

    def ids(self, collection: str, equals: dict[str, Any], doc_key: DocKey) -> AbstractSet[str]:
        return self._txn_keyed.ids(collection, equals)


class IndexedReads:
    """Reads of an in-process store with indexes: keys only, projections, no copies."""

    keeps_values = True
    any_ids = True

    def __init__(self, store: IndexedQueries) -> None:
        self._store = store
        self._txn: IndexedTransaction = _CLOSED

    def begin(self, read_only: bool) -> DocTransaction:
        self._txn = txn = self._store.begin_indexed(read_only=read_only)
        return txn

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        return self._txn.peek(collection, doc_id)

    def get_if(self, collection: str, doc_id: str, equals: dict[str, Any]
               ) -> dict[str, Any] | None:
        doc = self._txn.peek(collection, doc_id)
        if doc is None or any(doc.get(k) != v for k, v in equals.items()):
            return None
        return doc

    def ids(self, collection: str, equals: dict[str, Any], doc_key: DocKey) -> AbstractSet[str]:
        return self._txn.ids(collection, equals)

    def project(self, collection: str, equals: dict[str, Any], fields: tuple[str, ...],
                doc_key: DocKey) -> list[tuple[str, tuple[Any, ...]]]:
        return self._txn.project(collection, equals, fields)


def reads_for(store: DocStore) -> Callable[[], Reads]:
    """What builds the reads of a unit of work over ``store``, chosen from what it declares."""
    if isinstance(store, IndexedQueries):
        return lambda: IndexedReads(store)
    if isinstance(store, KeyQueries):
        return lambda: KeyedStoreReads(store)
    return lambda: StoreReads(store)
