"""A unit of work over any transactional document store.

Firestore, sqlite and a dict all offer the same primitive: read documents, write documents,
commit atomically. The repositories, identity map, idempotency record and outbox are written
once here on top of that primitive, so every backend gets the same semantics.
"""

from __future__ import annotations

import builtins
import json
import weakref
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from shared.adapters.doc_reads import Reads, reads_for
from shared.adapters.event_log import EVENTS as EVENTS  # re-exported: callers keep one import
from shared.adapters.event_log import DocEventLog as DocEventLog
from shared.adapters.event_log import EventCursor as EventCursor
from shared.adapters.mapper import MAPPERS, Mapper, Mappers
from shared.adapters.outbox import OUTBOX, envelope_to_doc, make_envelope
from shared.adapters.outbox import doc_id as _doc_id
from shared.domain.events import Envelope, Event
from shared.domain.model import Cluster, Job, Node, Partition, partition_key
from shared.ports import DocStore, DocTransaction, PageKey, Pruning, ReadOnlyWrite

CLUSTERS = "clusters"
NODES = "nodes"
JOBS = "jobs"
# the API's records beside the domain: {kind, id, project, location, parent, resource, created}
API_RESOURCES = "api_resources"
PARTITIONS = "partitions"
PROCESSED = "processed_events"
# retention horizon of idempotency records when no configuration is at hand
DEFAULT_IDEMPOTENCY_S = 2 * 3600.0


class _Repo:
    def __init__(self, uow: DocUnitOfWork, collection: str, mapper: Mapper[Any]) -> None:
        self._uow = uow
        self._collection = collection
        self._key = mapper.key

    def _get(self, doc_id: str) -> Any:
        return self._uow._load(self._collection, doc_id)

    def _get_if(self, doc_id: str, equals: dict[str, Any]) -> Any:
        return self._uow._load_if(self._collection, doc_id, equals)

    def add(self, entity: Any) -> None:
        self._uow._track(self._collection, self._key(entity), entity, loaded=None)

    def _list(self, equals: dict[str, Any]) -> list[Any]:
        return self._uow._query(self._collection, equals)

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

    def get_on(self, cluster_id: str, job_id: str) -> Job | None:
        """The job if it runs on ``cluster_id``; a job on another cluster is not read (the
        store compares its cluster first), so a lookup scoped to one tenant's clusters
        costs the same whether the id is another tenant's or no one's."""
        return self._get_if(job_id, {"cluster_id": cluster_id})  # type: ignore[no-any-return]

    def list(self, cluster_id: str | None = None, **equals: Any) -> list[Job]:
        query = dict(equals)
        if cluster_id is not None:
            query["cluster_id"] = cluster_id
        return self._list(query)

    def ids(self, **equals: Any) -> AbstractSet[str]:
        """The ids of the jobs whose fields equal ``equals`` (a keys-only query: a list
        filtered by state asks which jobs are in it without decoding them)."""
        return self._ids(equals)

    def project(self, cluster_id: str, fields: tuple[str, ...]) -> builtins.list[tuple[Any, ...]]:
        """The document fields ``fields`` of the cluster's jobs, without reading them into
        entities (a list page of 1 need not decode a cluster's 5,000 jobs)."""
        return self._project({"cluster_id": cluster_id}, fields)


class PartitionRepository(_Repo):
    def get(self, cluster_id: str, name: str) -> Partition | None:
        return self._get(partition_key(cluster_id, name))  # type: ignore[no-any-return]

    def list(self, cluster_id: str) -> list[Partition]:
        return self._list({"cluster_id": cluster_id})


class Pool(Protocol):
    """Where a pooled unit of work goes when it ends (``shared.adapters.uow_pool``)."""

    def give_back(self, uow: DocUnitOfWork) -> None: ...
    def take(self, uow: DocUnitOfWork) -> None:
        """``uow``, given back, is entered again by a holder: out of the free list."""
        ...


def _matches(mapper: Mapper[Any], entity: Any, plain: dict[str, Any]) -> bool:
    """Whether ``entity``'s document would match the query ``plain`` (field by field)."""
    value = mapper.value
    return all(value(entity, k) == v for k, v in plain.items())


def _values(mapper: Mapper[Any], entity: Any, fields: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(mapper.value(entity, f) for f in fields)


def _enum_plain(value: Any) -> Any:
    return getattr(value, "value", value)


class DocUnitOfWork:
    """Identity map + change tracking: only documents that changed are written at commit."""

    def __init__(self, store: DocStore, *, source: str = "//mtc/control-plane",
                 clock: Callable[[], float] | None = None, read_only: bool = False,
                 mappers: Mappers = MAPPERS, reads: Callable[[], Reads] | None = None,
                 pool: Pool | None = None) -> None:
        """``reads``: how to read ``store`` (``doc_reads.reads_for(store)``, chosen once by
        a factory of units of work); ``pool``: where it goes back when it ends (None: it
        is simply dropped)."""
        self._source = source
        self._clock = clock
        self._pool = pool
        self._pooled = False
        # over a read-only transaction (an API GET): no locks; a change is a bug (commit raises)
        self.read_only = read_only
        # the repositories reach back through a weak reference: no cycle, so a finished unit
        # of work and every entity it loaded are freed at once, not by the cyclic collector
        me = weakref.proxy(self)
        self.clusters = ClusterRepository(me, CLUSTERS, mappers.clusters)
        self.nodes = NodeRepository(me, NODES, mappers.nodes)
        self.jobs = JobRepository(me, JOBS, mappers.jobs)
        self.partitions = PartitionRepository(me, PARTITIONS, mappers.partitions)
        self._mappers: dict[str, Mapper[Any]] = {
            CLUSTERS: mappers.clusters, NODES: mappers.nodes, JOBS: mappers.jobs,
            PARTITIONS: mappers.partitions}
        self._reads = (reads or reads_for(store))()
        # what a commit compares an entity's document with: the document loaded where the
        # store keeps the values written; else (JSON gives lists for tuples) the entity's
        # own encoding as it was loaded, or every read would look like a change
        self._keeps_values = self._reads.keeps_values
        self._txn: DocTransaction | None = None
        self._tracked: dict[tuple[str, str], tuple[Any, dict[str, Any] | None]] = {}
        self._processed: list[tuple[str, float, float]] = []  # (key, at, expire_at)
        self._processed_ids: dict[str, str] = {}  # key -> its document id (hashed once)
        self._emitted: list[Event] = []
        self._records: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._cause_key = ""
        self.committed: list[Envelope] = []

    # -- context
    def __enter__(self) -> DocUnitOfWork:
        if self._txn is not None:
            raise RuntimeError("unit of work entered while it is in use")
        if self._pooled and self._pool is not None:  # entered again after it ended
            self._pool.take(self)  # (not to be handed out while this holder uses it)
        self._txn = self._reads.begin(self.read_only)
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

    def _load(self, collection: str, doc_id: str) -> Any:
        key = (collection, doc_id)
        if key in self._tracked:
            return self._tracked[key][0]
        self._require_txn()
        doc = self._reads.get(collection, doc_id)
        if doc is None:
            return None
        mapper = self._mappers[collection]
        entity = mapper.load(doc)
        self._tracked[key] = (entity, doc if self._keeps_values else mapper.dump(entity))
        return entity

    def _load_if(self, collection: str, doc_id: str, equals: dict[str, Any]) -> Any:
        """``_load`` if the document's fields ``equals`` match, compared before it is read
        (an entity this transaction holds: compared on the entity)."""
        key = (collection, doc_id)
        mapper = self._mappers[collection]
        if key in self._tracked:
            entity = self._tracked[key][0]
            plain = {k: _enum_plain(v) for k, v in equals.items()}
            return entity if entity is not None and _matches(mapper, entity, plain) else None
        self._require_txn()
        doc = self._reads.get_if(collection, doc_id, equals)
        if doc is None:
            return None
        entity = mapper.load(doc)
        self._tracked[key] = (entity, doc if self._keeps_values else mapper.dump(entity))
        return entity

    def _query(self, collection: str, equals: dict[str, Any]) -> list[Any]:
        plain = {k: _enum_plain(v) for k, v in equals.items()}
        out = []
        seen = set()
        tracked = self._tracked
        mapper = self._mappers[collection]
        doc_key, load, dump = mapper.doc_key, mapper.load, mapper.dump
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
                tracked[key] = (entity, doc if keeps else dump(entity))
            seen.add(key)
            out.append(entity)
        # entities added or changed in this transaction must be visible to its own queries
        for key, (entity, _) in self._tracked.items():
            if key[0] != collection or key in seen:
                continue
            if _matches(mapper, entity, plain):
                out.append(entity)
        return out

    def _query_ids(self, collection: str, equals: dict[str, Any]) -> AbstractSet[str]:
        plain = {k: _enum_plain(v) for k, v in equals.items()}
        self._require_txn()
        mapper = self._mappers[collection]
        found = self._reads.ids(collection, plain, mapper.doc_key)  # read-only
        # what this transaction changed answers from its entities, not the stored documents
        # (copied only when one of them changes the answer)
        added, dropped = set(), set()
        for (coll, doc_id), (entity, _) in self._tracked.items():
            if coll != collection:
                continue
            if _matches(mapper, entity, plain):
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
        self._require_txn()
        mapper = self._mappers[collection]
        rows = self._reads.project(collection, plain, fields, mapper.doc_key)
        tracked = {key[1]: entity for key, (entity, _) in self._tracked.items()
                   if key[0] == collection}
        if not tracked:
            return [row for _, row in rows]
        out = []
        for doc_id, row in rows:
            entity = tracked.pop(doc_id, None)
            out.append(row if entity is None else _values(mapper, entity, fields))
        for entity in tracked.values():
            if _matches(mapper, entity, plain):
                out.append(_values(mapper, entity, fields))
        return out

    def _track(self, collection: str, doc_id: str, entity: Any, loaded: dict[str, Any] | None
               ) -> None:
        self._tracked[(collection, doc_id)] = (entity, loaded)

    # -- idempotency and outbox
    def already_processed(self, key: str) -> bool:
        doc_id = self._processed_ids[key] = self._record_id(key)  # (kept for the write)
        self._require_txn()
        return self._reads.get(PROCESSED, doc_id) is not None  # (only asked whether it is there)

    def _record_id(self, key: str) -> str:
        """The idempotency record's document id: the key itself where the store takes any
        id, else hashed (Firestore ids cannot hold '/')."""
        return key if self._reads.any_ids else _doc_id(key)

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
    def record(self, collection: str, doc_id: str, *, where: dict[str, Any] | None = None
               ) -> dict[str, Any] | None:
        """The record ``doc_id``; with ``where``, only if its fields match, compared before
        it is read (``DocTransaction.get_if``): one of another owner costs what an absent
        one does."""
        if (collection, doc_id) in self._records:
            doc = self._records[(collection, doc_id)]
            if doc is not None and where and any(doc.get(k) != v for k, v in where.items()):
                return None
            return doc
        if where:
            return self._require_txn().get_if(collection, doc_id, where)
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

    def records_page(self, collection: str, equals: dict[str, Any], order: str, *,
                     after: PageKey | None = None, limit: int
                     ) -> list[tuple[str, dict[str, Any]]]:
        """(id, record) of one page of ``records`` in (``order``, id) order, after ``after``:
        the store's page (``DocTransaction.page``), with this unit of work's own writes
        over it (as many more asked of the store as it changed, so the page stays full)."""
        own = {doc_id: doc for (coll, doc_id), doc in self._records.items()
               if coll == collection}
        rows = self._require_txn().page(collection, equals, order, after=after,
                                        limit=limit + len(own))
        found = [(doc_id, doc) for doc_id, doc in rows if doc_id not in own]
        for doc_id, doc in own.items():
            if doc is not None and all(doc.get(k) == v for k, v in equals.items()) and (
                    after is None or (doc.get(order), doc_id) > after):
                found.append((doc_id, doc))
        if own:
            found.sort(key=lambda row: (row[1].get(order), row[0]))
        return found[:limit]

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
        mappers = self._mappers
        for (collection, doc_id), (entity, loaded) in self._tracked.items():
            doc = mappers[collection].dump(entity)
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
                   if self._mappers[c].dump(entity) != loaded]
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


class DocUnitsOfWork:
    """``Deps.uow``: a new unit of work over ``store`` per call, its way of reading the
    store chosen once, here."""

    def __init__(self, store: DocStore, *, source: str = "//mtc/control-plane",
                 clock: Callable[[], float] | None = None, mappers: Mappers = MAPPERS) -> None:
        self._store = store
        self._source = source
        self._clock = clock
        self._mappers = mappers
        self._reads = reads_for(store)

    def __call__(self, *, read_only: bool = False) -> DocUnitOfWork:
        return DocUnitOfWork(self._store, source=self._source, clock=self._clock,
                             read_only=read_only, mappers=self._mappers, reads=self._reads)


def prune_expired(store: DocStore, now: float, *, retention_s: float,
                  idempotency_s: float, limit: int = 5_000) -> int:
    """Delete event-log entries older than ``retention_s`` and idempotency records older than
    ``idempotency_s`` (at most ``limit`` each), on stores that prune by themselves (sqlite,
    memory). Firestore has no ``prune``: its TTL policy on ``expire_at`` does it."""
    if not isinstance(store, Pruning):
        return 0
    return store.prune(EVENTS, now - retention_s, limit) + store.prune(
        PROCESSED, now - idempotency_s, limit)


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)

