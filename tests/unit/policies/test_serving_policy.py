"""Serving decisions: the pool a deployed model's replicas run on, the traffic split, and
which replicas a request may go to (never a draining node's, never one not answering)."""

from __future__ import annotations

import pytest

from shared.policies.serving import (
    PoolOffer,
    ReplicaView,
    Wanted,
    choose_pool,
    replica_state,
    route_order,
    split_target,
)

H100 = ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8)


def offer(cluster: str, partition: str, machine: tuple[str, str | None, int] = H100,
          in_service: int = 4, created: float = 1.0) -> PoolOffer:
    return PoolOffer(cluster, created, partition, *machine, in_service)


def test_a_machine_type_alone_matches_a_pool_with_accelerators() -> None:
    chosen = choose_pool([offer("c1", "gpu")], Wanted("a3-highgpu-8g"))
    assert chosen is not None and chosen.partition == "gpu"


def test_an_accelerator_that_differs_matches_nothing() -> None:
    assert choose_pool([offer("c1", "gpu")], Wanted("a3-highgpu-8g", "NVIDIA_A100", 8)) is None
    assert choose_pool([offer("c1", "gpu")], Wanted("a3-highgpu-8g", None, 4)) is None
    assert choose_pool([offer("c1", "gpu")], Wanted("n2-standard-8")) is None


def test_the_most_nodes_in_service_win_then_the_oldest_cluster() -> None:
    pools = [offer("old", "a", in_service=2, created=1.0), offer("new", "b", in_service=6,
                                                                    created=2.0),
             offer("twin", "c", in_service=6, created=3.0)]
    assert choose_pool(pools, Wanted("a3-highgpu-8g")) == pools[1]


def test_a_named_cluster_and_partition_are_honoured() -> None:
    pools = [offer("c1", "a", in_service=8), offer("c2", "b", in_service=1),
             offer("c2", "z", in_service=1)]
    assert choose_pool(pools, Wanted("a3-highgpu-8g", cluster_id="c2")) == pools[1]
    assert choose_pool(pools, Wanted("a3-highgpu-8g", cluster_id="c2", partition="z")) == pools[2]
    assert choose_pool(pools, Wanted("a3-highgpu-8g", cluster_id="c3")) is None


@pytest.mark.parametrize(("roll", "expected"), [(0.0, "a"), (0.29, "a"), (0.3, "b"),
                                                (0.999, "b")])
def test_traffic_goes_by_share(roll: float, expected: str) -> None:
    assert split_target({"b": 70, "a": 30, "c": 0}, roll) == expected


def test_no_traffic_goes_nowhere() -> None:
    assert split_target({}, 0.5) is None
    assert split_target({"a": 0}, 0.5) is None


def view(name: str, *, running: bool = True, node: str | None = "allocated",
         healthy: bool = True) -> ReplicaView:
    return ReplicaView(name, running, node, healthy)


def test_only_ready_replicas_on_nodes_in_service_are_tried_in_rotation() -> None:
    replicas = [view("r0"), view("r1", node="draining"), view("r2", healthy=False),
                view("r3", running=False, node=None), view("r4", node="suspect")]
    assert route_order(replicas, 0) == ["r0", "r4"]
    assert route_order(replicas, 1) == ["r4", "r0"]
    assert route_order([view("r1", node="draining")], 0) == []


def test_a_replica_says_what_it_is_doing() -> None:
    assert replica_state(view("r")) == "READY"
    assert replica_state(view("r", node="draining")) == "MOVING"
    assert replica_state(view("r", healthy=False)) == "STARTING"
    assert replica_state(view("r", running=False, node=None)) == "STARTING"
