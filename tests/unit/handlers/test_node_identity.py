"""Node ids are one global collection: every cluster's nodes must keep ids of their own."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from services.job_submission import commands as job_commands
from services.provisioning.handlers import login_name, node_name
from shared.domain.model import ClusterState, Node, NodeRole, NodeState
from shared.domain.specs import ID_PATTERN
from tests.harness import Plane


def cluster(cluster_id: str, pool_id: str, count: int = 4) -> dict[str, Any]:
    return {
        "clusterId": cluster_id,
        "nodePools": [{"id": pool_id, "nodeCount": count, "spareCount": 0,
                       "machineSpec": {"machineType": "a3-highgpu-8g",
                                       "acceleratorType": "NVIDIA_H100_80GB",
                                       "acceleratorCount": 8}}],
        "partitions": [{"name": "train", "nodePoolIds": [pool_id]}],
    }


def state(plane: Plane, cluster_id: str) -> ClusterState:
    with plane.uow() as uow:
        found = uow.clusters.get(cluster_id)
    assert found is not None
    return found.state


def workers(plane: Plane, cluster_id: str) -> list[Node]:
    return [n for n in plane.nodes(cluster_id) if n.role is NodeRole.WORKER]


def test_nodes_stolen_across_clusters() -> None:
    plane = Plane().up(cluster("a", "b-c"))
    assert state(plane, "a") is ClusterState.READY
    mine = {n.node_id for n in plane.nodes("a")}
    assert len(workers(plane, "a")) == 4

    plane.api(job_commands.create_cluster, cluster("a-b", "c"))
    plane.deliver()

    # a's nodes stay a's, in their state (idle, in service), and a stays ready
    kept = plane.nodes("a")
    assert {n.node_id for n in kept} == mine
    assert all(n.cluster_id == "a" and n.state is NodeState.IDLE for n in kept)
    assert state(plane, "a") is ClusterState.READY
    # a-b gets nodes of its own, coming up
    theirs = workers(plane, "a-b")
    assert len(theirs) == 4
    assert not mine & {n.node_id for n in plane.nodes("a-b")}
    assert all(n.pool == "c" and n.state is NodeState.PROVISIONING for n in theirs)

    plane.bring_up()
    assert state(plane, "a-b") is ClusterState.READY
    assert all(n.state is NodeState.IDLE for n in plane.nodes("a") + plane.nodes("a-b"))


def test_ids_without_hyphens_keep_their_names() -> None:
    assert node_name("c1", "gpu", 1) == "c1-gpu-001"
    assert login_name("c1") == "c1-login"
    assert node_name("a", "b-c", 0) != node_name("a-b", "c", 0)


valid_ids = st.from_regex(ID_PATTERN, fullmatch=True)


@given(valid_ids, valid_ids, st.integers(0, 20_000), valid_ids, valid_ids,
       st.integers(0, 20_000))
@example("a", "b-c", 0, "a-b", "c", 0)
@example("a", "b--c", 7, "a--b", "c", 7)
@example("a", "b-000", 1, "a-b", "000", 1)
@example("x", "login", 0, "x-login", "y", 0)
def test_node_names_are_unambiguous(c1: str, p1: str, i1: int, c2: str, p2: str,
                                    i2: int) -> None:
    if (c1, p1, i1) != (c2, p2, i2):
        assert node_name(c1, p1, i1) != node_name(c2, p2, i2)
    if c1 != c2:
        assert login_name(c1) != login_name(c2)
    assert login_name(c1) != node_name(c2, p2, i2)


def test_provisioning_does_not_adopt_another_clusters_node_document() -> None:
    """Defence in depth: whatever made the id, a document of another cluster is never taken."""
    plane = Plane()
    squatter = Node(node_name("y", "gpu", 0), "x", "gpu", "train", NodeRole.WORKER,
                    "a3-highgpu-8g", "NVIDIA_H100_80GB", 8, NodeState.IDLE,
                    plane.clock.now())
    with plane.uow() as uow:
        uow.nodes.add(squatter)
        uow.commit()

    plane.api(job_commands.create_cluster, cluster("y", "gpu", count=2))
    plane.deliver()

    kept = plane.node(squatter.node_id)
    assert (kept.cluster_id, kept.state) == ("x", NodeState.IDLE)
    assert [n.node_id for n in workers(plane, "y")] == [node_name("y", "gpu", 1),
                                                         node_name("y", "gpu", 2)]
    plane.bring_up()
    assert state(plane, "y") is ClusterState.READY
    assert plane.node(squatter.node_id).cluster_id == "x"
