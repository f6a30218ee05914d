"""The persistence seam: how entities become documents and back (cosmicpython's mapper).

The domain's entities know one plain codec each (``to_dict``/``from_dict``). What a store
needs beyond it lives here, on the adapter side: the id of an entity and of a stored
document, one field of an entity's document for a query (``value``), the parse caches of
specs, and the node's faster codec. ``DocUnitOfWork`` takes one mapper per collection.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from shared.adapters.mapper import nodes
from shared.adapters.mapper.specs import ParseCache
from shared.domain.model import Cluster, Job, Node, Partition, partition_key
from shared.domain.specs import ClusterSpec, CustomJobSpec

E = TypeVar("E")


class Mapper(Protocol[E]):
    """An entity type's documents in one collection."""

    def load(self, doc: dict[str, Any]) -> E: ...
    def dump(self, entity: E) -> dict[str, Any]: ...
    def value(self, entity: E, name: str) -> Any:
        """``dump(entity).get(name)``, maybe without encoding the rest."""
        ...
    def key(self, entity: E) -> str:
        """The entity's document id."""
        ...
    def doc_key(self, doc: dict[str, Any]) -> str:
        """A stored document's id, read without decoding it."""
        ...


class PlainMapper(Generic[E]):
    """An entity's own codec, and its id from the entity or its document."""

    def __init__(self, load: Callable[[dict[str, Any]], E], dump: Callable[[E], dict[str, Any]],
                 key: Callable[[E], str], doc_key: Callable[[dict[str, Any]], str]) -> None:
        self.load = load
        self.dump = dump
        self.key = key
        self.doc_key = doc_key

    def value(self, entity: E, name: str) -> Any:
        return self.dump(entity).get(name)


class NodeMapper(PlainMapper[Node]):
    """Nodes, through the faster codec (:mod:`shared.adapters.mapper.nodes`)."""

    def __init__(self) -> None:
        super().__init__(nodes.load, nodes.dump, operator.attrgetter("node_id"),
                         operator.itemgetter("node_id"))

    def value(self, entity: Node, name: str) -> Any:
        return nodes.value(entity, name)


def cluster_mapper(specs: ParseCache[ClusterSpec]) -> PlainMapper[Cluster]:
    """Clusters, their specs through ``specs``."""
    return PlainMapper(lambda d: Cluster.from_dict(d, specs), lambda c: c.to_dict(specs.doc),
                       operator.attrgetter("cluster_id"), operator.itemgetter("cluster_id"))


def job_mapper(specs: ParseCache[CustomJobSpec]) -> PlainMapper[Job]:
    """Jobs, their specs through ``specs``."""
    return PlainMapper(lambda d: Job.from_dict(d, specs), lambda j: j.to_dict(specs.doc),
                       operator.attrgetter("job_id"), operator.itemgetter("job_id"))


def _partition_doc_key(doc: dict[str, Any]) -> str:
    return partition_key(doc["cluster_id"], doc["name"])


@dataclass(frozen=True)
class Mappers:
    """One mapper per entity collection."""

    clusters: Mapper[Cluster]
    nodes: Mapper[Node]
    jobs: Mapper[Job]
    partitions: Mapper[Partition]


def default_mappers() -> Mappers:
    """The mappers of this process: the specs' caches shared by every unit of work."""
    return Mappers(
        clusters=cluster_mapper(ParseCache(ClusterSpec.from_dict, ClusterSpec.to_dict)),
        nodes=NodeMapper(),
        jobs=job_mapper(ParseCache(CustomJobSpec.from_dict, CustomJobSpec.to_dict)),
        partitions=PlainMapper(Partition.from_dict, Partition.to_dict,
                               operator.attrgetter("key"), _partition_doc_key))


MAPPERS = default_mappers()
