"""Entity documents: what the domain's codecs and the mapper's (``shared.adapters.mapper``)
read and write, for every shape a store gives back."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from shared.adapters.mapper import nodes as node_codec
from shared.domain.health import FailureRecord, RepairAction
from shared.domain.model import Node, NodeCondition, NodeRole, NodeState

T = 1_700_000_000.0


def node() -> Node:
    n = Node("n1", "c", "gpu", "train", NodeRole.WORKER, "a3-highgpu-8g", "H100", 8,
             NodeState.ALLOCATED, T, job_id="j1", repair_action=RepairAction.REBOOT,
             history=[FailureRecord(T - 5, "gpu_fell_off_bus", RepairAction.REBOOT)])
    n.conditions["XidError"] = NodeCondition("false", "checked", T, T + 1)
    return n


LOADS = [Node.from_dict, node_codec.load]  # the domain's codec, the mapper's


@pytest.mark.parametrize("load", LOADS)
def test_round_trip_in_memory_and_through_json(load: Callable[[dict[str, Any]], Node]) -> None:
    n = node()
    doc = n.to_dict()
    assert load(doc) == n
    assert node_codec.dump(n) == doc
    # a store that keeps JSON (sqlite, Firestore) gives back lists and plain dicts
    assert load(json.loads(json.dumps(doc))) == n


@pytest.mark.parametrize("load", LOADS)
def test_derived_fields_are_written_and_not_read_back(
        load: Callable[[dict[str, Any]], Node]) -> None:
    doc = node().to_dict()
    assert doc["sound"] is True and doc["sound_for"] == "j1"
    assert not hasattr(load(doc), "sound_for")


def test_the_mapper_writes_the_domain_s_document_in_every_state() -> None:
    n = node()
    for state in NodeState:
        for fault in ("", "gpu_fell_off_bus"):
            n.state, n.fault = state, fault
            assert node_codec.dump(n) == n.to_dict(), (state, fault)


@pytest.mark.parametrize("load", LOADS)
def test_conditions_are_shared_not_copied_and_a_change_does_not_reach_the_document(
        load: Callable[[dict[str, Any]], Node]) -> None:
    doc = node_codec.dump(node())
    loaded = load(doc)
    assert loaded.conditions["XidError"] is doc["conditions"]["XidError"]
    assert loaded.conditions is not doc["conditions"]
    loaded.conditions["XidError"] = loaded.conditions["XidError"]._replace(status="true")
    loaded.history.append(FailureRecord(T, "x", RepairAction.RESET_GPU))
    assert doc["conditions"]["XidError"].status == "false"
    assert len(doc["history"]) == 1


@pytest.mark.parametrize("load", LOADS)
def test_an_older_document_gets_the_defaults(load: Callable[[dict[str, Any]], Node]) -> None:
    doc = {"node_id": "n", "cluster_id": "c", "pool": "p", "partition": "x", "role": "worker",
           "machine_type": "m", "state": "idle", "since": T}
    n = load(doc)
    assert (n.accelerator_type, n.accelerator_count, n.history, n.conditions) == (None, 0, [], {})
    assert n.generation == 1 and n.renewed_at is None


@pytest.mark.parametrize("load", LOADS)
def test_unknown_fields_are_ignored_and_missing_required_ones_raise(
        load: Callable[[dict[str, Any]], Node]) -> None:
    doc = {**node().to_dict(), "from_a_newer_version": 1}
    n = load(doc)
    assert n == node() and not hasattr(n, "from_a_newer_version")
    broken = node().to_dict()
    del broken["cluster_id"]
    with pytest.raises(KeyError, match="cluster_id"):
        load(broken)


def test_job_checkpoints_are_shared_and_survive_json() -> None:
    from shared.domain.model import Checkpoint, Job, JobState
    from shared.domain.specs import CustomJobSpec
    from tests.harness import job_body

    spec = CustomJobSpec.from_dict(job_body())
    job = Job("j1", "c", spec, JobState.RUNNING, T, T,
              checkpoints=[Checkpoint(10, "gs://b/ckpt-10", T, 1, 2.5)])
    doc = job.to_dict()
    loaded = Job.from_dict(doc)
    assert loaded.checkpoints == job.checkpoints and loaded.checkpoints is not doc["checkpoints"]
    assert loaded.checkpoints[0] is doc["checkpoints"][0]
    again = Job.from_dict(json.loads(json.dumps(doc)))
    assert again.checkpoints == [Checkpoint(10, "gs://b/ckpt-10", T, 1, 2.5)]
    # an older document without the measured save cost
    old = {**doc, "checkpoints": [[10, "gs://b/ckpt-10", T, 1]]}
    assert Job.from_dict(old).checkpoints[0].save_s == 0.0


def test_job_ranks_are_tuples_shared_with_the_document() -> None:
    from shared.domain.model import Job, JobState
    from shared.domain.specs import CustomJobSpec
    from tests.harness import job_body

    job = Job("j1", "c", CustomJobSpec.from_dict(job_body()), JobState.RUNNING, T, T,
              node_ids=["a", ""], previous_node_ids=["a", "b"])  # type: ignore[arg-type]
    assert job.node_ids == ("a", "") and job.previous_node_ids == ("a", "b")
    doc = job.to_dict()
    loaded = Job.from_dict(doc)
    assert loaded.node_ids is doc["node_ids"]  # no copy of a 2,048-rank list per read
    assert loaded.to_dict() == doc
    assert Job.from_dict(json.loads(json.dumps(doc))).node_ids == ("a", "")


def test_one_field_of_the_document_is_the_document_s() -> None:
    """The node mapper's ``value`` answers a query's field without encoding the node: the
    same value as the document's, derived fields included, in every state."""
    n = node()
    for state in NodeState:
        n.state = state
        for fault in ("", "gpu_fell_off_bus"):
            n.fault = fault
            doc = n.to_dict()
            for name in [*doc, "not_a_field"]:
                assert node_codec.value(n, name) == doc.get(name), (state, fault, name)


@pytest.mark.parametrize("doc", [
    {"cluster_id": "c1", "name": "train"},  # an older document: the defaults
    {"cluster_id": "c1", "name": "train", "total_nodes": 4, "out_of_service": ["n1", "n3"],
     "removed_at": [1.0, 2.0], "settling": 1},
    {"cluster_id": "c1", "name": "train", "out_of_service": ["n3", "n1"]},  # not sorted
])
def test_a_partition_decodes_as_its_dataclass_builds_it(doc: dict[str, object]) -> None:
    """``Partition.from_dict`` is the dataclass built from the same values, through JSON
    too; its document lists the ids taken out sorted."""
    from shared.domain.partition import Partition

    ids = list(doc.get("out_of_service", []))  # type: ignore[call-overload]
    built = Partition("c1", "train", doc.get("total_nodes", 0), set(ids),  # type: ignore[arg-type]
                      list(doc.get("removed_at", [])), doc.get("settling", 0))  # type: ignore[call-overload,arg-type]
    decoded = Partition.from_dict(doc)  # type: ignore[arg-type]
    assert decoded == built and decoded.to_dict() == built.to_dict()
    assert Partition.from_dict(json.loads(json.dumps(decoded.to_dict()))) == built
    decoded.take_out("n2", 5.0, 60.0)
    assert decoded.to_dict()["out_of_service"] == sorted({*ids, "n2"})
