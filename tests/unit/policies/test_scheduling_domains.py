"""place_jobs() packs a gang into the fewest NVLink domains: table tests."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.policies.scheduling import JobRequest, NodeSlot, ReplicaGroup, place_jobs

GPU = ReplicaGroup("a3-highgpu-8g", "nvidia-h100-80gb", 8, 1)


def fleet(layout: dict[str, int], *, spare_in: tuple[str, ...] = ()) -> list[NodeSlot]:
    """``{"d1": 3}``: three idle nodes d1-0..d1-2 in NVLink domain d1 (the last one a spare
    when d1 is in ``spare_in``)."""
    return [NodeSlot(f"{domain}-{i}", "a", GPU.machine_type, GPU.accelerator_type, 8,
                     domain in spare_in and i == count - 1, domain)
            for domain, count in layout.items() for i in range(count)]


def want(replicas: int, **extra: object) -> JobRequest:
    return JobRequest("j", "a", (replace(GPU, replica_count=replicas),), 0, 0.0,
                      **extra)  # type: ignore[arg-type]


def domains_of(node_ids: tuple[str, ...]) -> list[str]:
    return sorted({n.rsplit("-", 1)[0] for n in node_ids})


# (idle layout, replicas, the domains the gang lands in)
PACKING = [
    # fits in one: the smallest domain that holds it (the big one stays whole for a big job)
    ({"a": 8, "b": 4, "c": 2}, 4, ["b"]),
    ({"a": 8, "b": 4, "c": 2}, 2, ["c"]),
    ({"a": 8, "b": 4, "c": 2}, 5, ["a"]),
    # fits in none: the fullest first, so the fewest domains (a+b, not b+c+...)
    ({"a": 3, "b": 6, "c": 2, "d": 2}, 8, ["a", "b"]),
    ({"a": 4, "b": 4, "c": 4}, 12, ["a", "b", "c"]),
    # by node id alone this gang would straddle a0..a1 + b0..b1 (a has only 2)
    ({"a": 2, "b": 4}, 4, ["b"]),
]


@pytest.mark.parametrize(("layout", "replicas", "expected"), PACKING)
def test_a_gang_is_packed_into_the_fewest_domains(layout: dict[str, int], replicas: int,
                                                  expected: list[str]) -> None:
    out = place_jobs([want(replicas)], fleet(layout), 0.0)
    assert len(out) == 1 and len(out[0].node_ids) == replicas
    assert domains_of(out[0].node_ids) == expected


def test_without_domains_placement_is_by_node_id_as_before() -> None:
    idle = [slot._replace(domain="") for slot in fleet({"a": 2, "b": 4})]
    out = place_jobs([want(4)], idle, 0.0)
    assert out[0].node_ids == ("a-0", "a-1", "b-0", "b-1")


def test_a_hot_spare_in_the_jobs_own_domain_wins_over_one_elsewhere() -> None:
    idle = fleet({"a": 2, "b": 2}, spare_in=("a", "b"))
    out = place_jobs([want(1, is_resume=True, near_domains=("b",))], idle, 0.0)
    assert out[0].node_ids == ("b-1",)  # b's spare, though a-1 sorts first
    out = place_jobs([want(1, is_resume=True)], idle, 0.0)
    assert out[0].node_ids == ("a-1",)  # no domain of its own: the first spare


def test_spares_still_come_before_idle_nodes_of_the_jobs_domain() -> None:
    idle = fleet({"a": 2, "b": 2}, spare_in=("a",))
    out = place_jobs([want(1, is_resume=True, near_domains=("b",))], idle, 0.0)
    assert out[0].node_ids == ("a-1",)


def test_fresh_jobs_never_take_spares_when_packing() -> None:
    idle = fleet({"a": 4, "b": 4}, spare_in=("a", "b"))
    out = place_jobs([want(4)], idle, 0.0)
    assert domains_of(out[0].node_ids) == ["a", "b"]  # 3 free workers in each: needs two
    assert not {"a-3", "b-3"} & set(out[0].node_ids)
