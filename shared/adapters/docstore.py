"""A unit of work over any transactional document store.

Firestore, sqlite and a dict all offer the same primitive: read documents, write documents,
commit atomically. The repositories, identity map, idempotency record and outbox are written
once here on top of that primitive, so every backend gets the same semantics.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import operator
import weakref
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar

from shared.adapters.event_log import EVENTS as EVENTS  # re-exported: callers keep one import
from shared.adapters.event_log import DocEventLog as DocEventLog
from shared.adapters.event_log import EventCursor as EventCursor
from shared.adapters.outbox import OUTBOX, envelope_to_doc, make_envelope
from shared.adapters.outbox import doc_id as _doc_id
from shared.domain.events import Envelope, Event
from shared.domain.model import Cluster, Job, Node, Partition, partition_key
from shared.ports import DocStore, DocTransaction, ReadOnlyWrite

CLUSTERS = "clusters"
NODES = "nodes"
JOBS = "jobs"
PARTITIONS = "partitions"
PROCESSED = "processed_events"
# retention horizon of idempotency records when no configuration is at hand
DEFAULT_IDEMPOTENCY_S = 2 * 3600.0


T = TypeVar("T")


class _Repo:
    def __init__(self, uow: DocUnitOfWork, collection: str, id_of: Callable[[Any], str],
                 load: Callable[[dict[str, Any]], Any]) -> None:
        self._uow = uow
        self._collection = collection
        self._id_of = id_of
        self._load = load

    def _get(self, doc_id: str) -> Any:
        return self._uow._load(self._collection, doc_id, self._load)

    def add(self, entity: Any) -> None:
        self._uow._track(self._collection, self._id_of(entity), entity, loaded=None)

    def _list(self, equals: dict[str, Any]) -> list[Any]:
        return self._uow._query(self._collection, equals, self._load)

    def _ids(self, equals: dict[str, Any]) -> AbstractSet[str]:
        return self._uow._query_ids(self._collection, equals)

    def _project(self, equals: dict[str, Any], fields: tuple[str, ...]) -> list[tuple[Any, ...]]:
        return self._uow._project(self._collection, equals, fields)


class ClusterRepository(_Repo):
    def get(self, cluster_id: str) -> Cluster | None:
        return self._get(cluster_id)  # type: ignore[no-any-return]

    def list(self) -> list[Cluster]:
        return self._list({})


class NodeRepository(_Repo):
    def get(self, node_id: str) -> Node | None:
        return self._get(node_id)  # type: ignore[no-any-return]

    def list(self, cluster_id: str, **equals: Any) -> list[Node]:
        return self._list({"cluster_id": cluster_id, **equals})

    def ids(self, cluster_id: str, **equals: Any) -> AbstractSet[str]:
        """The ids ``list`` would return, without reading the nodes (a keys-only query), to
        read within the unit of work: a restart asks which of a job's 2,048 nodes are
        sound, and loads only the others."""
        return self._ids({"cluster_id": cluster_id, **equals})

    def project(self, cluster_id: str, fields: tuple[str, ...], **equals: Any
                ) -> builtins.list[tuple[Any, ...]]:
        """The document fields ``fields`` of the nodes ``list`` would return, in its order,
        without reading them into entities (a projection): scheduling's view of 16,000 idle
        nodes is six fields each, not 16,000 decoded nodes written back at commit."""
        return self._project({"cluster_id": cluster_id, **equals}, fields)


class JobRepository(_Repo):
    def get(self, job_id: str) -> Job | None:
        return self._get(job_id)  # type: ignore[no-any-return]

    def list(self, cluster_id: str | None = None, **equals: Any) -> list[Job]:
        query = dict(equals)
        if cluster_id is not None:
            query["cluster_id"] = cluster_id
        return self._list(query)


class PartitionRepository(_Repo):
    def get(self, cluster_id: str, name: str) -> Partition | None:
        return self._get(partition_key(cluster_id, name))  # type: ignore[no-any-return]

    def list(self, cluster_id: str) -> list[Partition]:
        return self._list({"cluster_id": cluster_id})


_cluster_id = operator.attrgetter("cluster_id")
_node_id = operator.attrgetter("node_id")
_job_id = operator.attrgetter("job_id")
_partition_key = operator.attrgetter("key")


def _partition_doc_key(doc: dict[str, Any]) -> str:
    return partition_key(doc["cluster_id"], doc["name"])


# collection -> the id of a stored document, read without decoding it
_DOC_KEYS: dict[str, Callable[[dict[str, Any]], str]] = {
    CLUSTERS: operator.itemgetter("cluster_id"), NODES: operator.itemgetter("node_id"),
    JOBS: operator.itemgetter("job_id"), PARTITIONS: _partition_doc_key}


class UnitsOfWork:
    """``Deps.uow``: a unit of work over ``store`` per call, one that ended handed out again
    (building one, its four repositories and the weak reference they share, was a quarter
    of a delivery's frame: 4.5 of 17 us). A unit of work is entered once per hand-out;
    nested and concurrent ones each get their own. At most ``keep`` wait to be reused."""

    def __init__(self, store: DocStore, *, source: str = "//mtc/control-plane",
                 clock: Callable[[], float] | None = None, keep: int = 8) -> None:
        self._store = store
        self._source = source
        self._clock = clock
        self._keep = keep
        # (a list's pop, append and remove are each atomic: threads share it without a lock;
        # a race can only keep one more or one fewer)
        self._free: list[DocUnitOfWork] = []

    def __call__(self, *, read_only: bool = False) -> DocUnitOfWork:
        try:
            uow = self._free.pop()
        except IndexError:
            uow = DocUnitOfWork(self._store, source=self._source, clock=self._clock, pool=self)
        uow._pooled = False
        uow.read_only = read_only
        return uow

    def give_back(self, uow: DocUnitOfWork) -> None:
        if not uow._pooled and len(self._free) < self._keep:
            uow._pooled = True
            self._free.append(uow)

    def take(self, uow: DocUnitOfWork) -> None:
        """Take ``uow`` out of the free list: its holder entered it again."""
        if uow._pooled:
            uow._pooled = False
            with contextlib.suppress(ValueError):  # handed out meanwhile: not there any more
                self._free.remove(uow)


def _matches(entity: Any, plain: dict[str, Any]) -> bool:
    """Whether ``entity``'s document would match the query ``plain``; an entity that can
    give one field of its document (``doc_value``) is not encoded whole for it."""
    value = getattr(entity, "doc_value", None)
    if value is None:
        doc = entity.to_dict()
        return all(doc.get(k) == v for k, v in plain.items())
    return all(value(k) == v for k, v in plain.items())


def _values(entity: Any, fields: tuple[str, ...]) -> tuple[Any, ...]:
    value = getattr(entity, "doc_value", None)
    return tuple(map(value or entity.to_dict().get, fields))


# a transaction class -> (keeps_values, any_ids): what its store offers, looked up once
_CAPABILITIES: dict[type, tuple[bool, bool]] = {}


def _outside(collection: str, doc_id: str) -> dict[str, Any] | None:
    raise RuntimeError("unit of work used outside 'with'")


def _enum_plain(value: Any) -> Any:
    return getattr(value, "value", value)


class DocUnitOfWork:
    """Identity map + change tracking: only documents that changed are written at commit."""

    def __init__(self, store: DocStore, *, source: str = "//mtc/control-plane",
                 clock: Callable[[], float] | None = None,
                 pool: UnitsOfWork | None = None) -> None:
        self._store = store
        self._source = source
        self._clock = clock
        self._pool = pool  # where it goes back when it ends (None: it is simply dropped)
        self._pooled = False
        # over a read-only transaction (an API GET): no locks; a change is a bug (commit raises)
        self.read_only = False
        # the repositories reach back through a weak reference: no cycle, so a finished unit
        # of work and every entity it loaded are freed at once, not by the cyclic collector
        # (one per event: a million objects in a 54-day Llama 3 run)
        me = weakref.proxy(self)
        self.clusters = ClusterRepository(me, CLUSTERS, _cluster_id, Cluster.from_dict)
        self.nodes = NodeRepository(me, NODES, _node_id, Node.from_dict)
        self.jobs = JobRepository(me, JOBS, _job_id, Job.from_dict)
        self.partitions = PartitionRepository(me, PARTITIONS, _partition_key,
                                              Partition.from_dict)
        self._txn: DocTransaction | None = None
        # whether the transaction gives documents back with the values written (tuples as
        # tuples: the memory store's ``keeps_values``); a store that goes through JSON
        # (sqlite, Firestore) gives lists, so what commit compares an entity with is the
        # entity's own encoding as it was loaded, or every read would look like a change
        # and write the document back
        self._keeps_values = False
        self._any_ids = False  # the store takes any key as a document id (else: hashed)
        self._read: Callable[[str, str], dict[str, Any] | None] = _outside
        self._tracked: dict[tuple[str, str], tuple[Any, dict[str, Any] | None]] = {}
        self._processed: list[tuple[str, float, float]] = []  # (key, at, expire_at)
        self._processed_ids: dict[str, str] = {}  # key -> its document id (hashed once)
        self._emitted: list[Event] = []
        self._records: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._cause_key = ""
        self.committed: list[Envelope] = []

    # -- context
    def __enter__(self) -> DocUnitOfWork:
        if self._pooled:  # entered again by a holder after it ended: not to be handed out
            self._pool.take(self)  # type: ignore[union-attr]
        store = self._store
        txn = self._txn = store.begin(read_only=True) if self.read_only else store.begin()
        kind = type(txn)
        caps = _CAPABILITIES.get(kind)
        if caps is None:
            caps = _CAPABILITIES[kind] = (bool(getattr(kind, "keeps_values", False)),
                                          bool(getattr(kind, "any_ids", False)))
        self._keeps_values, self._any_ids = caps
        # a store that can hand a document over uncopied (the memory store's ``peek``) does:
        # decoding only reads it, and an entity's writes are new documents put at commit
        self._read = getattr(txn, "peek", None) or txn.get
        self._tracked.clear()
        self._processed.clear()
        self._processed_ids.clear()
        self._emitted.clear()
        self._records.clear()
        self.committed = []
        return self

    def __exit__(self, *exc: object) -> None:
        if self._txn is not None:
            self.rollback()
        self._tracked.clear()  # the entities it loaded are freed now, not at its next use
        if self._pool is not None:
            self._pool.give_back(self)

    def caused_by(self, key: str) -> None:
        """Derive outbox ids from the triggering event, so a re-run emits the same ids."""
        self._cause_key = key

    # -- tracking
    def _require_txn(self) -> DocTransaction:
        if self._txn is None:
            raise RuntimeError("unit of work used outside 'with'")
        return self._txn

    def _load(self, collection: str, doc_id: str, load: Callable[[dict[str, Any]], Any]) -> Any:
        key = (collection, doc_id)
        if key in self._tracked:
            return self._tracked[key][0]
        self._require_txn()
        doc = self._read(collection, doc_id)
        if doc is None:
            return None
        entity = load(doc)
        self._tracked[key] = (entity, doc if self._keeps_values else entity.to_dict())
        return entity

    def _query(self, collection: str, equals: dict[str, Any],
               load: Callable[[dict[str, Any]], Any]) -> list[Any]:
        plain = {k: _enum_plain(v) for k, v in equals.items()}
        out = []
        seen = set()
        tracked = self._tracked
        doc_key = _DOC_KEYS[collection]
        keeps = self._keeps_values
        for doc in self._require_txn().query(collection, plain):
            # a document this transaction already holds is not decoded again (a restart
            # lists a cluster's partitions twice; the second list is the first's entities)
            key = (collection, doc_key(doc))
            held = tracked.get(key)
            if held is not None:
                entity = held[0]
            else:
                entity = load(doc)
                tracked[key] = (entity, doc if keeps else entity.to_dict())
            seen.add(key)
            out.append(entity)
        # entities added or changed in this transaction must be visible to its own queries
        for key, (entity, _) in self._tracked.items():
            if key[0] != collection or key in seen:
                continue
            if _matches(entity, plain):
                out.append(entity)
        return out

    def _query_ids(self, collection: str, equals: dict[str, Any]) -> AbstractSet[str]:
        plain = {k: _enum_plain(v) for k, v in equals.items()}
        txn = self._require_txn()
        keys_only = getattr(txn, "ids", None)
        found: AbstractSet[str]
        if keys_only is not None:
            found = keys_only(collection, plain)  # read-only: maybe the store's index
        else:  # a store without keys-only queries: read the documents
            found = set(map(_DOC_KEYS[collection], txn.query(collection, plain)))
        # what this transaction changed answers from its entities, not the stored documents
        # (copied only when one of them changes the answer)
        added, dropped = set(), set()
        for (coll, doc_id), (entity, _) in self._tracked.items():
            if coll != collection:
                continue
            if _matches(entity, plain):
                if doc_id not in found:
                    added.add(doc_id)
            elif doc_id in found:
                dropped.add(doc_id)
        return (found | added) - dropped if added or dropped else found

    def _project(self, collection: str, equals: dict[str, Any], fields: tuple[str, ...]
                 ) -> list[tuple[Any, ...]]:
        """What ``_query`` returns, as field tuples: stored matches in store order (those this
        transaction tracks from their entities), then tracked entities that now match."""
        plain = {k: _enum_plain(v) for k, v in equals.items()}
        txn = self._require_txn()
        select = getattr(txn, "project", None)
        if select is not None:
            rows = select(collection, plain, fields)
        else:  # a store without projections: read the documents
            doc_key = _DOC_KEYS[collection]
            rows = [(doc_key(doc), tuple(map(doc.get, fields)))
                    for doc in txn.query(collection, plain)]
        tracked = {key[1]: entity for key, (entity, _) in self._tracked.items()
                   if key[0] == collection}
        if not tracked:
            return [row for _, row in rows]
        out = []
        for doc_id, row in rows:
            entity = tracked.pop(doc_id, None)
            out.append(row if entity is None else _values(entity, fields))
        for entity in tracked.values():
            if _matches(entity, plain):
                out.append(_values(entity, fields))
        return out

    def _track(self, collection: str, doc_id: str, entity: Any, loaded: dict[str, Any] | None
               ) -> None:
        self._tracked[(collection, doc_id)] = (entity, loaded)

    # -- idempotency and outbox
    def already_processed(self, key: str) -> bool:
        doc_id = self._processed_ids[key] = self._record_id(key)  # (kept for the write)
        self._require_txn()
        return self._read(PROCESSED, doc_id) is not None  # (only asked whether it is there)

    def _record_id(self, key: str) -> str:
        """The idempotency record's document id: the key itself where the store takes any
        id, else hashed (Firestore ids cannot hold '/')."""
        return key if self._any_ids else _doc_id(key)

    def mark_processed(self, key: str, now: float, *, expire_at: float | None = None) -> None:
        """Record ``key`` as handled at ``now``; ``expire_at`` is its retention horizon (a TTL
        field on Firestore; the embedded stores prune by ``time``)."""
        self._processed.append(
            (key, now, now + DEFAULT_IDEMPOTENCY_S if expire_at is None else expire_at))

    def emit(self, event: Event) -> None:
        self._emitted.append(event)

    @property
    def emitted(self) -> bool:
        """Whether this unit of work has queued any event (yet)."""
        return bool(self._emitted)

    # -- plain records beside the entities (the API's operations and resource parents),
    #    written in the same commit, so a resource and its records appear together or not at all
    def record(self, collection: str, doc_id: str) -> dict[str, Any] | None:
        if (collection, doc_id) in self._records:
            return self._records[(collection, doc_id)]
        return self._require_txn().get(collection, doc_id)

    def records(self, collection: str, equals: dict[str, Any]) -> list[dict[str, Any]]:
        found = {str(d["_id"]): d for d in self._require_txn().query(collection, equals)}
        for (coll, doc_id), doc in self._records.items():
            if coll != collection:
                continue
            found.pop(doc_id, None)
            if doc is not None and all(doc.get(k) == v for k, v in equals.items()):
                found[doc_id] = doc
        return list(found.values())

    def put_record(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None:
        self._records[(collection, doc_id)] = {**doc, "_id": doc_id}

    def delete_record(self, collection: str, doc_id: str) -> None:
        """Removes a record, or an entity's document (after its tracked writes)."""
        self._records[(collection, doc_id)] = None

    # -- commit
    def commit(self) -> None:
        txn = self._require_txn()
        if self.read_only:
            self._end_read(txn)
            return
        for (collection, doc_id), (entity, loaded) in self._tracked.items():
            doc = entity.to_dict()
            if doc != loaded:
                txn.put(collection, doc_id, doc)
        for (collection, doc_id), record in self._records.items():
            if record is None:
                txn.delete(collection, doc_id)
            else:
                txn.put(collection, doc_id, record)
        ids = self._processed_ids
        for key, at, expire_at in self._processed:
            doc_id = ids.get(key) or self._record_id(key)
            txn.put(PROCESSED, doc_id, {"key": key, "at": at, "time": at,
                                        "expire_at": expire_at})
        envelopes: list[Envelope] = []
        if self._emitted:
            self._outbox(txn, envelopes)
        txn.commit()
        self._txn = None
        self.committed = envelopes

    def _end_read(self, txn: DocTransaction) -> None:
        """Commit of a read-only unit of work: it must have changed nothing."""
        changed = [f"{c}/{i}" for (c, i), (entity, loaded) in self._tracked.items()
                   if entity.to_dict() != loaded]
        changed += [f"{c}/{i}" for c, i in self._records]
        if self._processed or self._emitted:
            changed.append("an idempotency record or an event")
        if changed:
            raise ReadOnlyWrite(f"a read-only unit of work changed {', '.join(changed[:5])}")
        txn.commit()  # ends it: nothing to write
        self._txn = None
        self.committed = []

    def _outbox(self, txn: DocTransaction, envelopes: list[Envelope]) -> None:
        """The emitted events as envelopes, written to the outbox in this transaction."""
        now = self._clock() if self._clock else (self._processed[0][1] if self._processed else 0.0)
        for i, event in enumerate(self._emitted):
            seed = f"{self._cause_key}|{i}|{event.TYPE}|{event.subject}" if self._cause_key else None
            env = make_envelope(event, self._source, now, seed=seed)
            txn.put(OUTBOX, env.id, envelope_to_doc(env))
            envelopes.append(env)

    def rollback(self) -> None:
        if self._txn is not None:
            self._txn.rollback()
            self._txn = None
        self._tracked.clear()
        self._processed.clear()
        self._emitted.clear()
        self._records.clear()


def prune_expired(store: DocStore, now: float, *, retention_s: float,
                  idempotency_s: float, limit: int = 5_000) -> int:
    """Delete event-log entries older than ``retention_s`` and idempotency records older than
    ``idempotency_s`` (at most ``limit`` each), on stores that prune by themselves (sqlite,
    memory). Firestore has no ``prune``: its TTL policy on ``expire_at`` does it."""
    prune = getattr(store, "prune", None)
    if prune is None:
        return 0
    return int(prune(EVENTS, now - retention_s, limit)) + int(
        prune(PROCESSED, now - idempotency_s, limit))


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)

