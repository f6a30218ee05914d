"""The persistence seam (``shared.adapters.mapper``): what the mappers write is what the
entities' own codecs write, and the spec caches cannot be corrupted by a holder that
changes a document it was given."""

from __future__ import annotations

import copy
import json

from shared.adapters.mapper import MAPPERS
from shared.adapters.mapper.specs import ParseCache
from shared.domain.model import Checkpoint, Cluster, ClusterState, Job, JobState
from shared.domain.specs import ClusterSpec, CustomJobSpec
from tests.harness import CLUSTER, job_body

T = 1_700_000_000.0


def job() -> Job:
    return Job("j1", "c1", CustomJobSpec.from_dict(job_body()), JobState.RUNNING, T, T,
               node_ids=("a", ""), checkpoints=[Checkpoint(10, "gs://b/c", T, 1, 2.0)])


def cluster() -> Cluster:
    return Cluster("c1", ClusterSpec.from_dict(CLUSTER), ClusterState.READY, T, T)


def test_the_mappers_write_and_read_what_the_entities_do() -> None:
    for mapper, entity in ((MAPPERS.jobs, job()), (MAPPERS.clusters, cluster())):
        doc = mapper.dump(entity)  # type: ignore[attr-defined]
        assert doc == entity.to_dict()
        assert mapper.load(doc) == entity == type(entity).from_dict(doc)  # type: ignore[attr-defined]
        assert mapper.load(json.loads(json.dumps(doc))) == entity  # type: ignore[attr-defined]
        for name in [*doc, "not_a_field"]:
            assert mapper.value(entity, name) == doc.get(name)  # type: ignore[attr-defined]


def test_a_spec_document_changed_by_its_holder_does_not_change_the_cache() -> None:
    cache = ParseCache(CustomJobSpec.from_dict, CustomJobSpec.to_dict)
    spec = CustomJobSpec.from_dict(job_body())
    pristine = spec.to_dict()
    given = cache.doc("j1", spec)
    assert given == pristine
    # a holder changes what it was given, nested values too
    given["displayName"] = "changed"
    given["jobSpec"]["workerPoolSpecs"].clear()
    assert cache.doc("j1", spec) == pristine  # not the changed one
    assert cache("j1", pristine) is spec
    changed = copy.deepcopy(pristine)
    changed["displayName"] = "renamed"
    assert cache("j1", changed).display_name == "renamed"  # a changed document: parsed again


def test_a_parsed_document_changed_in_place_is_parsed_again() -> None:
    cache = ParseCache(CustomJobSpec.from_dict, CustomJobSpec.to_dict)
    doc = CustomJobSpec.to_dict(CustomJobSpec.from_dict(job_body()))
    first = cache("j1", doc)
    assert cache("j1", doc) is first
    doc["displayName"] = "renamed in place"
    renamed = cache("j1", doc)
    assert renamed.display_name == "renamed in place"
    assert cache.doc("j1", renamed) == doc
