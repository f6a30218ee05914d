"""Every edge of every state table, allowed and refused."""

from __future__ import annotations

import pytest

from shared.domain.errors import InvalidTransition
from shared.domain.model import (
    CLUSTER_TRANSITIONS,
    JOB_TRANSITIONS,
    NODE_TRANSITIONS,
    Cluster,
    ClusterState,
    Job,
    JobState,
    Node,
    NodeRole,
    NodeState,
)
from shared.domain.specs import ClusterSpec, CustomJobSpec
from tests.harness import CLUSTER, job_body

SPEC = ClusterSpec.parse(CLUSTER)
JOB_SPEC = CustomJobSpec.parse(job_body())


def node_in(state: NodeState) -> Node:
    return Node("n1", "c1", "gpu", "train", NodeRole.WORKER, "a3", "H100", 8, state, 0.0)


@pytest.mark.parametrize(("src", "dst", "allowed"), NODE_TRANSITIONS.all_pairs())
def test_node_transition(src: NodeState, dst: NodeState, allowed: bool) -> None:
    node = node_in(src)
    if src is dst and src is not NodeState.REPAIRING:
        node.transition(dst, 5.0)  # re-applying the desired state is a no-op
        assert node.state is src and node.since == 0.0
        return
    if allowed:
        node.transition(dst, 5.0, "why")
        assert (node.state, node.since, node.reason) == (dst, 5.0, "why")
    else:
        with pytest.raises(InvalidTransition) as err:
            node.transition(dst, 5.0)
        assert f"from {src.value} to {dst.value}" in str(err.value)
        assert node.state is src


@pytest.mark.parametrize(("src", "dst", "allowed"), JOB_TRANSITIONS.all_pairs())
def test_job_transition(src: JobState, dst: JobState, allowed: bool) -> None:
    job = Job("j1", "c1", JOB_SPEC, src, 0.0, 0.0)
    if allowed:
        job.transition(dst, 5.0)
        assert job.state is dst
        assert (job.ended_at == 5.0) == job.terminal
    else:
        with pytest.raises(InvalidTransition):
            job.transition(dst, 5.0)
        assert job.state is src


@pytest.mark.parametrize(("src", "dst", "allowed"), CLUSTER_TRANSITIONS.all_pairs())
def test_cluster_transition(src: ClusterState, dst: ClusterState, allowed: bool) -> None:
    cluster = Cluster("c1", SPEC, src, 0.0, 0.0)
    if allowed:
        cluster.transition(dst, 5.0, "m")
        assert cluster.state is dst
    else:
        with pytest.raises(InvalidTransition):
            cluster.transition(dst, 5.0)
        assert cluster.state is src


def test_terminal_states_have_no_way_out() -> None:
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert not JOB_TRANSITIONS.edges[state]
    assert not NODE_TRANSITIONS.edges[NodeState.RETIRED]


def test_entities_round_trip_through_documents() -> None:
    node = node_in(NodeState.REPAIRING)
    assert Node.from_dict(node.to_dict()) == node
    job = Job("j1", "c1", JOB_SPEC, JobState.RUNNING, 1.0, 2.0, node_ids=["a", "b"])
    assert Job.from_dict(job.to_dict()) == job
    cluster = Cluster("c1", SPEC, ClusterState.READY, 1.0, 2.0)
    assert Cluster.from_dict(cluster.to_dict()) == cluster
