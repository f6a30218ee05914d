"""The document store's port (``DocStore``, its transactions) and what a store may offer
beyond it: the floor ``UnitOfWork`` adapters (``shared.adapters.docstore``) stand on.
``shared.ports`` names them too."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any, Protocol, runtime_checkable

PageKey = tuple[Any, str]  # (the order field's value, the document id) of a page's last document


class DocTransaction(Protocol):
    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None: ...
    def get_if(self, collection: str, doc_id: str, equals: dict[str, Any]
               ) -> dict[str, Any] | None:
        """``get``, but only if the document's fields ``equals`` match: the fields are
        compared before the document is read, so one that does not match costs what an
        absent one does (a lookup scoped to a tenant never tells that another tenant has
        the id). On sqlite that holds for the fields ``sqlite_store.OWNERS`` indexes."""
        ...
    def query(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]: ...
    def page(self, collection: str, equals: dict[str, Any], order: str, *,
             after: PageKey | None = None, limit: int) -> list[tuple[str, dict[str, Any]]]:
        """(id, document) of at most ``limit`` documents ``query`` would return, in ascending
        (``order`` field, id) order, and only those after ``after`` (the previous page's
        last key): one page of a list, read through an index (sqlite's expression index,
        Firestore's composite one), so a page costs its own documents, not the
        collection's. The ``order`` field holds values of one type in every matching
        document."""
        ...
    def put(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None: ...
    def delete(self, collection: str, doc_id: str) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...


class ReadOnlyWrite(RuntimeError):
    """A write in a read-only transaction: a bug in the code that asked for one (an API GET
    that changes state), never the caller's fault."""


class DocStore(Protocol):
    def begin(self, *, read_only: bool = False) -> DocTransaction:
        """A transaction. ``read_only``: a consistent snapshot that takes no write locks
        (Firestore's read-only transaction, sqlite's deferred one), so a reader never holds up
        or aborts a handler's commit; its ``put`` and ``delete`` raise ``ReadOnlyWrite`` and
        its ``commit`` only ends it."""
        ...
    def read(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        """A read outside any transaction (listings, the outbox sweeper, the timeline)."""
        ...
    def write(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None: ...
    def remove(self, collection: str, doc_id: str) -> None: ...
    def oldest(self, collection: str, limit: int) -> list[dict[str, Any]]:
        """The ``limit`` documents with the smallest (time, seq): the outbox's next batch."""
        ...


# ---- what a store offers beyond the DocStore port: each a capability a store declares by
#      implementing it, which its users choose once, when they are built

class KeysOnly(Protocol):
    """A transaction that answers which documents match without reading them."""

    def ids(self, collection: str, equals: dict[str, Any]) -> AbstractSet[str]:
        """The ids of the documents ``query`` would return; read-only (maybe an index's own
        set), valid while the transaction lasts."""
        ...


class Projection(Protocol):
    """A transaction that reads some fields of the matching documents (Firestore's
    ``select``), without copying or decoding the rest."""

    def project(self, collection: str, equals: dict[str, Any], fields: tuple[str, ...]
                ) -> list[tuple[str, tuple[Any, ...]]]:
        """(id, the values of ``fields``) of the documents ``query`` would return, in its
        order."""
        ...


class IndexedTransaction(DocTransaction, KeysOnly, Projection, Protocol):
    """A transaction of an :class:`IndexedQueries` store."""

    def peek(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        """``get`` without the copy, for a reader that never changes what it is given."""
        ...


class KeyedTransaction(DocTransaction, KeysOnly, Protocol):
    """A transaction of a :class:`KeyQueries` store."""


@runtime_checkable
class KeyQueries(Protocol):
    """A store whose transactions answer keys-only queries from its own indexes (sqlite:
    the ids, not the documents), though its documents still go through JSON."""

    def begin_keyed(self, *, read_only: bool = False) -> KeyedTransaction: ...


@runtime_checkable
class IndexedQueries(Protocol):
    """A store in this process (the memory store): its transactions answer keys-only queries
    and projections from its indexes and hand a document over uncopied; documents come back
    with the values written (no JSON between: tuples stay tuples), and any string is a
    document id ('/' too)."""

    def begin_indexed(self, *, read_only: bool = False) -> IndexedTransaction: ...


@runtime_checkable
class Pruning(Protocol):
    """A store that deletes old documents itself (sqlite, memory); Firestore's TTL policy on
    ``expire_at`` does it there."""

    def prune(self, collection: str, before: float, limit: int) -> int:
        """Delete up to ``limit`` documents whose ``time`` is older than ``before``."""
        ...


@runtime_checkable
class RangeReads(Protocol):
    """A store with a time index: an incremental reader never reads the whole collection."""

    def since(self, collection: str, time: float) -> list[dict[str, Any]]:
        """Documents with ``time >= time`` in (time, seq) order."""
        ...


@runtime_checkable
class Claiming(Protocol):
    """A store with optimistic concurrency outside transactions (Firestore's update time)."""

    def claim(self, collection: str, doc_id: str, *, field: str, now: float,
              until: float) -> bool:
        """Set ``field`` to ``until`` if the document exists and ``field`` is unset or past
        ``now``: of several processes claiming one document at once, exactly one wins."""
        ...
