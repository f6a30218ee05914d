"""place_jobs(): gangs, ordering, spares, previous nodes, partitions, backfill, determinism."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.policies.scheduling import JobRequest, NodeSlot, Placement, ReplicaGroup, place_jobs

NOW = 1_000.0
GPU = ReplicaGroup("a3-highgpu-8g", "nvidia-h100-80gb", 8, 1)


def gpu(node_id: str, partition: str = "a", *, spare: bool = False) -> NodeSlot:
    return NodeSlot(node_id, partition, "a3-highgpu-8g", "nvidia-h100-80gb", 8, spare)


def cpu(node_id: str, partition: str = "a") -> NodeSlot:
    return NodeSlot(node_id, partition, "n2-standard-8", None, 0, False)


def job(
    job_id: str,
    replicas: int = 1,
    *,
    partition: str | None = "a",
    priority: int = 0,
    at: float = 0.0,
    resume: bool = False,
    previous: tuple[str, ...] = (),
    groups: tuple[ReplicaGroup, ...] | None = None,
) -> JobRequest:
    return JobRequest(
        job_id,
        partition,
        groups or (ReplicaGroup(GPU.machine_type, GPU.accelerator_type, 8, replicas),),
        priority,
        at,
        resume,
        previous,
    )


def placed(placements: tuple[Placement, ...]) -> dict[str, tuple[str, ...]]:
    return {p.job_id: p.node_ids for p in placements}


# --- gang ---------------------------------------------------------------------------------------


def test_a_gang_gets_all_its_nodes_in_node_id_order() -> None:
    out = place_jobs([job("j", 3)], [gpu("n3"), gpu("n1"), gpu("n2"), gpu("n4")], NOW)
    assert out == (Placement("j", ("n1", "n2", "n3")),)


def test_a_gang_that_does_not_fit_gets_nothing() -> None:
    assert place_jobs([job("j", 3)], [gpu("n1"), gpu("n2")], NOW) == ()


def test_every_group_must_fit() -> None:
    groups = (
        ReplicaGroup(GPU.machine_type, GPU.accelerator_type, 8, 2),
        ReplicaGroup("n2-standard-8", None, 0, 1),
    )
    assert place_jobs([job("j", groups=groups)], [gpu("g1"), gpu("g2")], NOW) == ()
    out = place_jobs([job("j", groups=groups)], [cpu("c1"), gpu("g2"), gpu("g1")], NOW)
    assert out == (Placement("j", ("g1", "g2", "c1")),)  # group 0 first, in rank order


def test_shape_must_match_exactly() -> None:
    other_count = NodeSlot("n1", "a", "a3-highgpu-8g", "nvidia-h100-80gb", 4, False)
    other_type = NodeSlot("n2", "a", "a3-highgpu-8g", "nvidia-a100-80gb", 8, False)
    other_machine = NodeSlot("n3", "a", "a2-highgpu-8g", "nvidia-h100-80gb", 8, False)
    assert place_jobs([job("j")], [other_count, other_type, other_machine], NOW) == ()


# --- ordering -----------------------------------------------------------------------------------


def test_priority_then_age_then_id() -> None:
    pending = [
        job("old-low", at=1.0, priority=0),
        job("new-high", at=5.0, priority=9),
        job("b-mid", at=2.0, priority=5),
        job("a-mid", at=2.0, priority=5),
        job("older-mid", at=1.5, priority=5),
    ]
    out = place_jobs(pending, [gpu(f"n{i}") for i in range(3)], NOW, backfill=True)
    assert [p.job_id for p in out] == ["new-high", "older-mid", "a-mid"]


# --- spares and previous nodes ------------------------------------------------------------------


def test_fresh_jobs_never_take_spares() -> None:
    idle = [gpu("s1", spare=True), gpu("s2", spare=True), gpu("n1")]
    assert place_jobs([job("j", 2)], idle, NOW) == ()
    assert place_jobs([job("j", 1)], idle, NOW) == (Placement("j", ("n1",)),)


def test_resumed_job_takes_previous_then_spares_then_others() -> None:
    idle = [gpu("n0"), gpu("s1", spare=True), gpu("n2"), gpu("n9")]
    out = place_jobs([job("j", 3, resume=True, previous=("n9", "dead", "n2"))], idle, NOW)
    # n9 and n2 keep ranks 0 and 2; the lost rank 1 goes to the spare, not to n0.
    assert out == (Placement("j", ("n9", "s1", "n2")),)


def test_resumed_job_falls_back_to_other_idle_nodes() -> None:
    idle = [gpu("n5"), gpu("n4"), gpu("n2")]
    out = place_jobs([job("j", 3, resume=True, previous=("n2", "dead1", "dead2"))], idle, NOW)
    assert out == (Placement("j", ("n2", "n4", "n5")),)


def test_previous_nodes_of_the_wrong_shape_are_not_forced() -> None:
    idle = [cpu("c1"), gpu("g1")]
    out = place_jobs([job("j", 1, resume=True, previous=("c1",))], idle, NOW)
    assert out == (Placement("j", ("g1",)),)


def test_a_fresh_job_ignores_previous_ids() -> None:
    idle = [gpu("s1", spare=True), gpu("n1"), gpu("n2")]
    out = place_jobs([job("j", 1, previous=("n2", "s1"))], idle, NOW)
    assert out == (Placement("j", ("n2",)),)  # previous order still breaks ties, spares excluded


# --- partitions and blocking ------------------------------------------------------------------


def test_partition_must_match_when_named() -> None:
    idle = [gpu("b1", "b"), gpu("a1", "a")]
    assert place_jobs([job("j", 2, partition="a")], idle, NOW) == ()
    assert place_jobs([job("j", 2, partition=None)], idle, NOW) == (Placement("j", ("a1", "b1")),)


def test_without_backfill_a_blocked_job_holds_its_partition() -> None:
    idle = [gpu("a1"), gpu("a2"), gpu("b1", "b")]
    pending = [
        job("big", 3, partition="a", priority=9),
        job("small-a", 1, partition="a", priority=1),
        job("small-any", 1, partition=None, priority=1, at=1.0),
        job("small-b", 1, partition="b", priority=1, at=2.0),
    ]
    out = placed(place_jobs(pending, idle, NOW))
    assert out == {"small-b": ("b1",)}


def test_with_backfill_smaller_jobs_go_around() -> None:
    idle = [gpu("a1"), gpu("a2"), gpu("b1", "b")]
    pending = [
        job("big", 3, partition="a", priority=9),
        job("small-a", 1, partition="a", priority=1),
        job("small-any", 1, partition=None, priority=1, at=1.0),
        job("small-b", 1, partition="b", priority=1, at=2.0),
    ]
    out = placed(place_jobs(pending, idle, NOW, backfill=True))
    assert out == {"small-a": ("a1",), "small-any": ("a2",), "small-b": ("b1",)}


def test_a_blocked_job_without_partition_blocks_everything() -> None:
    idle = [gpu("a1"), gpu("b1", "b")]
    pending = [job("big", 3, partition=None, priority=9), job("small-b", 1, partition="b")]
    assert place_jobs(pending, idle, NOW) == ()
    assert placed(place_jobs(pending, idle, NOW, backfill=True)) == {"small-b": ("b1",)}


def test_higher_ranked_jobs_are_placed_before_a_blocked_lower_one() -> None:
    idle = [gpu("a1"), gpu("a2")]
    pending = [job("first", 2, priority=5), job("second", 1, priority=1)]
    assert placed(place_jobs(pending, idle, NOW)) == {"first": ("a1", "a2")}


# --- validation and determinism ---------------------------------------------------------------


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="node_id"):
        place_jobs([job("j")], [gpu("n1"), gpu("n1")], NOW)
    with pytest.raises(ValueError, match="job_id"):
        place_jobs([job("j"), job("j")], [gpu("n1")], NOW)


def test_request_validation() -> None:
    with pytest.raises(ValueError, match="replica_count"):
        ReplicaGroup("m", None, 0, 0)
    with pytest.raises(ValueError, match="group"):
        JobRequest("j", None, (), 0, 0.0, False)


def test_input_order_does_not_matter() -> None:
    idle = [gpu(f"n{i}", "ab"[i % 2], spare=i % 3 == 0) for i in range(9)]
    pending = [
        job("r", 2, partition=None, resume=True, previous=("n4", "n7")),
        job("x", 2, partition="a", priority=2),
        job("y", 1, partition="b", at=3.0),
    ]
    a = place_jobs(pending, idle, NOW)
    b = place_jobs(list(reversed(pending)), list(reversed(idle)), NOW)
    assert a == b
    assert a  # something was placed


# --- properties ---------------------------------------------------------------------------------

_SHAPES = [
    ("a3", "h100", 8),
    ("a2", "a100", 8),
    ("n2", None, 0),
]


@st.composite
def _scenario(draw: st.DrawFn) -> tuple[list[JobRequest], list[NodeSlot]]:
    node_count = draw(st.integers(min_value=0, max_value=14))
    idle = []
    for i in range(node_count):
        machine, accel, count = draw(st.sampled_from(_SHAPES))
        idle.append(
            NodeSlot(
                f"n{i:02d}", draw(st.sampled_from("ab")), machine, accel, count, draw(st.booleans())
            )
        )
    jobs = []
    for j in range(draw(st.integers(min_value=0, max_value=6))):
        groups = tuple(
            ReplicaGroup(*draw(st.sampled_from(_SHAPES)), draw(st.integers(1, 3)))
            for _ in range(draw(st.integers(1, 2)))
        )
        previous = tuple(
            draw(st.lists(st.sampled_from([n.node_id for n in idle] or ["x"]), max_size=4))
        )
        jobs.append(
            JobRequest(
                f"j{j}",
                draw(st.sampled_from([None, "a", "b"])),
                groups,
                draw(st.integers(0, 3)),
                draw(st.floats(0, 100)),
                draw(st.booleans()),
                previous,
            )
        )
    return jobs, idle


@pytest.mark.slow
@given(_scenario(), st.booleans())
def test_placements_are_whole_valid_and_disjoint(
    scenario: tuple[list[JobRequest], list[NodeSlot]], backfill: bool
) -> None:
    jobs, idle = scenario
    nodes = {n.node_id: n for n in idle}
    by_id = {j.job_id: j for j in jobs}
    out = place_jobs(jobs, idle, NOW, backfill=backfill)
    used = [node_id for p in out for node_id in p.node_ids]
    assert len(used) == len(set(used))  # never a node twice
    for p in out:
        request = by_id[p.job_id]
        slots = [g for g in request.groups for _ in range(g.replica_count)]
        assert len(p.node_ids) == len(slots)  # never a partial gang
        for group, node_id in zip(slots, p.node_ids, strict=True):
            node = nodes[node_id]
            assert group.fits(node)
            assert request.partition is None or node.partition == request.partition
            assert request.is_resume or not node.is_spare
    assert out == place_jobs(list(reversed(jobs)), list(reversed(idle)), NOW, backfill=backfill)


@pytest.mark.slow
@given(_scenario())
def test_backfill_changes_nothing_before_the_first_blocked_job(
    scenario: tuple[list[JobRequest], list[NodeSlot]],
) -> None:
    jobs, idle = scenario
    strict = place_jobs(jobs, idle, NOW)
    loose = place_jobs(jobs, idle, NOW, backfill=True)
    strict_by_job = placed(strict)
    prefix = []
    for request in sorted(jobs, key=JobRequest.rank_key):
        if request.job_id not in strict_by_job:
            break
        prefix.append(Placement(request.job_id, strict_by_job[request.job_id]))
    assert loose[: len(prefix)] == tuple(prefix)
    assert len(loose) >= len(prefix)
