"""Firestore document store: the unit of work's backend on Google Cloud (and its emulator).

Layout: one top-level collection per kind (see ``docs/gcp.md``), document id = the entity's
id, fields = the entity's ``to_dict()`` (native Firestore maps, arrays and numbers, so the
console and queries see real fields). Nested arrays, which Firestore forbids, are wrapped
on the way in and unwrapped on the way out.

Transactions: ``begin()`` opens one Firestore read-write transaction (``begin(read_only=True)``
a read-only one: a snapshot that takes no locks, for the API's GETs; it writes nothing). Reads (``get``,
``query``) run inside it, so Firestore locks what the handler read; writes are buffered
and sent with the commit, in one atomic ``Commit`` with the idempotency record and the
outbox entries. When another transaction wrote what this one read, Firestore aborts the
commit (or a read, in the emulator): that surfaces as :class:`Contention`, a
``TransientError``. The unit of work cannot re-run the handler by itself, so the error
propagates: the function answers 500 and Pub/Sub redelivers the event, and the new attempt
runs in a new transaction that sees the winner's state. The idempotency record guarantees
the winner's effect is not applied twice.

Writes outside a transaction (``write``/``remove``: event log, dead letters, outbox
deletes) are idempotent by document id. Where several processes may race on one of them
(the outbox sweeper), ``claim`` gives optimistic concurrency: an update guarded by the
document's update time, which exactly one claimant wins.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter
from google.cloud.firestore_v1.field_path import FieldPath

from shared.domain.errors import TransientError
from shared.ports import PageKey, ReadOnlyWrite

log = logging.getLogger("mtc.firestore")

_DELETED = object()
_NESTED = "~list"  # Firestore arrays cannot hold arrays: [[1, 2]] -> [{_NESTED: [1, 2]}]
TTL_FIELD = "expire_at"  # the retention horizon of event-log entries and idempotency records

# What a contended or briefly unavailable Firestore raises: retrying (redelivery) may help.
RETRYABLE = (gexc.Aborted, gexc.DeadlineExceeded, gexc.ServiceUnavailable,
             gexc.InternalServerError, gexc.TooManyRequests, gexc.Conflict)


class Contention(TransientError):
    """Another transaction changed what this one read; run the handler again."""


def encode(value: Any, *, in_array: bool = False) -> Any:
    """Plain JSON-like data into what Firestore accepts."""
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        inner = [encode(v, in_array=True) for v in items]
        return {_NESTED: inner} if in_array else inner
    return value


def encode_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """A document into Firestore fields; ``expire_at`` (epoch seconds) becomes a timestamp,
    the type a TTL policy reads (deploy/cloudbuild.py enables one on it)."""
    out: dict[str, Any] = encode(doc)
    expire = out.get(TTL_FIELD)
    if isinstance(expire, int | float):
        out[TTL_FIELD] = datetime.datetime.fromtimestamp(expire, tz=datetime.UTC)
    return out


def decode(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.timestamp()  # only expire_at is stored as a timestamp
    if isinstance(value, dict):
        if len(value) == 1 and _NESTED in value:
            return [decode(v) for v in value[_NESTED]]
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def _retrying(fn: Any, *args: Any, attempts: int = 5, **kwargs: Any) -> Any:
    """Single-document operations outside transactions: retry what is transient."""
    import time

    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except RETRYABLE:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")


class FirestoreTransaction:
    """One read-write transaction; the unit of work's ``DocTransaction``."""

    def __init__(self, store: FirestoreDocStore, read_only: bool = False) -> None:
        self._store = store
        self._read_only = read_only
        self._txn = store.client.transaction(max_attempts=1, read_only=read_only)
        self._writes: dict[tuple[str, str], Any] = {}
        try:
            self._txn._begin()
        except RETRYABLE as exc:
            raise Contention(f"cannot begin a transaction: {exc}") from exc

    def get(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        pending = self._writes.get((collection, doc_id))
        if pending is _DELETED:
            return None
        if pending is not None:
            return dict(pending)
        ref = self._store.ref(collection, doc_id)
        try:
            snapshots = list(self._txn.get(ref))
        except RETRYABLE as exc:
            raise Contention(f"concurrent transaction held {collection}/{doc_id}: {exc}") from exc
        snap = snapshots[0] if snapshots else None
        if snap is None or not snap.exists:
            return None
        return decode(snap.to_dict())  # type: ignore[no-any-return]

    def get_if(self, collection: str, doc_id: str, equals: dict[str, Any]
               ) -> dict[str, Any] | None:
        """``get`` if the document's fields ``equals`` match: a query on its name and those
        fields, so Firestore compares them and a document that does not match comes back
        as an absent one does (nothing)."""
        pending = self._writes.get((collection, doc_id))
        if pending is not None:  # this transaction's own write
            doc = None if pending is _DELETED else dict(pending)
            return doc if doc is not None and all(
                doc.get(k) == v for k, v in equals.items()) else None
        ref = self._store.ref(collection, doc_id)
        query = self._store.query(collection, equals).where(
            filter=FieldFilter("__name__", "==", ref)).limit(1)
        try:
            found = [decode(s.to_dict()) for s in query.stream(transaction=self._txn)]
        except RETRYABLE as exc:
            raise Contention(f"concurrent transaction held {collection}/{doc_id}: {exc}") from exc
        return found[0] if found else None

    def query(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        query = self._store.query(collection, equals)
        try:
            return [decode(s.to_dict()) for s in query.stream(transaction=self._txn)]
        except RETRYABLE as exc:
            raise Contention(f"concurrent transaction held {collection} {equals}: {exc}") from exc

    def page(self, collection: str, equals: dict[str, Any], order: str, *,
             after: PageKey | None = None, limit: int) -> list[tuple[str, dict[str, Any]]]:
        """One page in (``order``, document id) order, through a composite index of the
        ``equals`` fields and ``order`` (``deploy/firestore.indexes.json``): Firestore reads
        only the page's documents."""
        if not order.replace("_", "").isalnum():
            raise ValueError(f"bad field name {order!r}")
        query = (self._store.query(collection, equals).order_by(order)
                 .order_by(FieldPath.document_id()))
        if after is not None:
            query = query.start_after([encode(after[0]), after[1]])
        try:
            return [(s.id, decode(s.to_dict()))
                    for s in query.limit(limit).stream(transaction=self._txn)]
        except RETRYABLE as exc:
            raise Contention(f"concurrent transaction held {collection} {equals}: {exc}") from exc

    def put(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        if self._read_only:
            raise ReadOnlyWrite(f"put {collection}/{doc_id} in a read-only transaction")
        self._writes[(collection, doc_id)] = doc

    def delete(self, collection: str, doc_id: str) -> None:
        if self._read_only:
            raise ReadOnlyWrite(f"delete {collection}/{doc_id} in a read-only transaction")
        self._writes[(collection, doc_id)] = _DELETED

    def commit(self) -> None:
        if self._read_only:  # nothing to write: ending it is releasing it
            self._abandon()
            return
        for (collection, doc_id), doc in self._writes.items():
            ref = self._store.ref(collection, doc_id)
            if doc is _DELETED:
                self._txn.delete(ref)
            else:
                self._txn.set(ref, encode_doc(doc))
        try:
            self._txn._commit()
        except RETRYABLE as exc:
            self._abandon()
            raise Contention(f"commit lost to a concurrent transaction: {exc}") from exc
        except BaseException:
            self._abandon()
            raise
        finally:
            self._writes.clear()

    def rollback(self) -> None:
        self._writes.clear()
        self._abandon()

    def _abandon(self) -> None:
        if self._txn.in_progress:
            try:
                self._txn._rollback()
            except gexc.GoogleAPICallError as exc:  # the server drops it by itself anyway
                log.debug("rollback failed: %s", exc)


class FirestoreDocStore:
    """``DocStore`` over a Firestore database, with ``Claiming`` (``shared.ports``); ``prefix``
    namespaces the collections."""

    def __init__(self, client: firestore.Client, *, prefix: str = "") -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def connect(cls, project: str, *, database: str | None = None, prefix: str = ""
                ) -> FirestoreDocStore:
        """A client for ``project``; FIRESTORE_EMULATOR_HOST, when set, selects the emulator."""
        kwargs: dict[str, Any] = {"project": project}
        if database:
            kwargs["database"] = database
        return cls(firestore.Client(**kwargs), prefix=prefix)

    def collection(self, name: str) -> Any:
        return self.client.collection(self.prefix + name)

    def ref(self, collection: str, doc_id: str) -> Any:
        return self.collection(collection).document(doc_id)

    def query(self, collection: str, equals: dict[str, Any]) -> Any:
        query = self.collection(collection)
        for field, value in equals.items():
            if not field.replace("_", "").isalnum():
                raise ValueError(f"bad field name {field!r}")
            query = query.where(filter=FieldFilter(field, "==", encode(value)))
        return query

    # -- DocStore
    def begin(self, *, read_only: bool = False) -> FirestoreTransaction:
        return FirestoreTransaction(self, read_only)

    def read(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        query = self.query(collection, equals)
        docs = _retrying(lambda: [s.to_dict() for s in query.stream()])
        return [decode(d) for d in docs]

    def write(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        _retrying(self.ref(collection, doc_id).set, encode_doc(doc))

    def remove(self, collection: str, doc_id: str) -> None:
        _retrying(self.ref(collection, doc_id).delete)

    def oldest(self, collection: str, limit: int) -> list[dict[str, Any]]:
        """Ordered by (time, seq): served by the composite index in deploy/firestore.indexes.json."""
        query = (self.collection(collection)
                 .order_by("time").order_by("seq").limit(limit))
        docs = _retrying(lambda: [s.to_dict() for s in query.stream()])
        return [decode(d) for d in docs]

    # -- optimistic concurrency outside transactions
    def claim(self, collection: str, doc_id: str, *, field: str, now: float,
              until: float) -> bool:
        """Set ``field`` to ``until`` if the document exists and its ``field`` is unset or
        past ``now``, guarded by the document's update time: of several processes claiming
        the same document at once, exactly one gets True."""
        ref = self.ref(collection, doc_id)
        snap = _retrying(ref.get)
        if not snap.exists:
            return False
        held = (snap.to_dict() or {}).get(field)
        if isinstance(held, int | float) and held > now:
            return False
        option = self.client.write_option(last_update_time=snap.update_time)
        try:
            ref.update({field: until}, option=option)
        except (gexc.FailedPrecondition, gexc.NotFound, gexc.Aborted):
            return False
        return True

    def delete_all(self, collections: Iterable[str]) -> None:
        """Remove every document of these collections (tools and tests; not transactional)."""
        for name in collections:
            for snap in self.collection(name).stream():
                snap.reference.delete()
