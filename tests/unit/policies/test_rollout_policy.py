"""The rollout's wave plan and regression decision, table-driven."""

from __future__ import annotations

import math

import pytest

from shared.domain.errors import ValidationError
from shared.policies.rollout import (
    Candidate,
    FleetHealth,
    RegressionConfig,
    judge,
    merged,
    parse_version,
    plan_waves,
    poisson_at_least,
    wave_cost_s,
)

IDLE = [Candidate(f"i{k}", "p") for k in range(5)]
BUSY = [Candidate("b-dear", "p", True, 900.0), Candidate("b-cheap", "p", True, 60.0)]


@pytest.mark.parametrize(("candidates", "budget", "size", "canary", "waves"), [
    # idle first; the canary alone; then waves of the size asked
    (IDLE + BUSY, {"p": 2}, 2, 1,
     (("i0",), ("i1", "i2"), ("i3", "i4"), ("b-cheap", "b-dear"))),
    # the guard's budget caps a wave asked bigger
    (IDLE, {"p": 2}, 5, 0, (("i0", "i1"), ("i2", "i3"), ("i4",))),
    # two partitions: the budget is per partition, so a wave mixes them
    ([Candidate("a1", "a"), Candidate("a2", "a"), Candidate("b1", "b")], {"a": 1, "b": 1}, 3,
     0, (("a1", "b1"), ("a2",))),
    # a budget of 0 (everything out already) still lets one node go at a time
    (IDLE[:2], {"p": 0}, 2, 0, (("i0",), ("i1",))),
    # busy nodes by their job's move cost, cheapest first
    (BUSY, {"p": 1}, 1, 0, (("b-cheap",), ("b-dear",))),
    ([], {}, 2, 1, ()),
])
def test_plan_waves(candidates: list[Candidate], budget: dict[str, int], size: int,
                    canary: int, waves: tuple[tuple[str, ...], ...]) -> None:
    plan = plan_waves(candidates, budget, size, canary)
    assert plan.waves == waves


def test_a_plan_costs_the_moves_of_its_busy_nodes_only() -> None:
    plan = plan_waves(IDLE + BUSY, {"p": 2}, 2, 1)
    assert wave_cost_s(plan, IDLE + BUSY) == 960.0


@pytest.mark.parametrize(("size", "canary", "path"), [(0, 1, "waveSize"), (2, -1, "canary")])
def test_bad_sizes_are_refused(size: int, canary: int, path: str) -> None:
    with pytest.raises(ValidationError) as err:
        plan_waves(IDLE, {"p": 2}, size, canary)
    assert err.value.path == path


H = 3600.0


@pytest.mark.parametrize(("health", "regressed"), [
    (FleetHealth(), False),
    (FleetHealth(gate_failed=("n2", "n1"), updated_nodes=5), True),
    # twice the fleet's rate and more, with enough time and faults behind it
    (FleetHealth(updated_faults=4, updated_node_s=4 * H, other_faults=1, other_node_s=10 * H),
     True),
    # the same rate as the fleet
    (FleetHealth(updated_faults=2, updated_node_s=10 * H, other_faults=2, other_node_s=10 * H),
     False),
    # twice the rate, but two faults where the fleet's rate expects 0.45: chance
    (FleetHealth(updated_faults=2, updated_node_s=330 * H, other_faults=1,
                 other_node_s=730 * H), False),
    # one fault is noise however short the time
    (FleetHealth(updated_faults=1, updated_node_s=2 * H, other_node_s=10 * H), False),
    # too little time on the new version to judge a rate
    (FleetHealth(updated_faults=3, updated_node_s=H / 2, other_node_s=10 * H), False),
])
def test_judge(health: FleetHealth, regressed: bool) -> None:
    verdict = judge(health, RegressionConfig())
    assert verdict.regressed is regressed
    assert bool(verdict.reason) is regressed


@pytest.mark.parametrize(("failed", "updated", "tolerance", "regressed"), [
    (1, 1, 0.0, True), (1, 20, 0.0, True),  # strict: any one
    (1, 20, 0.1, False), (2, 20, 0.1, False), (3, 20, 0.1, True),
    (1, 1, 0.5, True),  # a canary of one that fails is more than half
])
def test_a_gate_tolerance_is_a_share_of_the_updated_nodes(failed: int, updated: int,
                                                          tolerance: float,
                                                          regressed: bool) -> None:
    health = FleetHealth(gate_failed=tuple(f"n{i}" for i in range(failed)),
                         updated_nodes=updated)
    assert judge(health, RegressionConfig(gate_tolerance=tolerance)).regressed is regressed


def test_poisson_tail() -> None:
    assert poisson_at_least(0, 3.0) == 1.0
    assert abs(poisson_at_least(2, 0.45) - (1 - math.exp(-0.45) * 1.45)) < 1e-12
    assert poisson_at_least(10, 2.0) < 1e-4


def test_a_failed_gate_names_the_nodes() -> None:
    assert "n1, n2" in judge(FleetHealth(gate_failed=("n2", "n1"), updated_nodes=2)).reason


def test_versions_parse_and_merge() -> None:
    assert parse_version({"driver": " 550.90 "}) == {"driver": "550.90"}
    assert merged({"nodeImage": "a", "driver": "1"}, {"driver": "2"}) == {
        "nodeImage": "a", "driver": "2"}
    for bad, path in (({}, "version"), ({"kernel": "x"}, "version.kernel"),
                      ({"agent": ""}, "version.agent"), ("v2", "version")):
        with pytest.raises(ValidationError) as err:
            parse_version(bad)
        assert err.value.path == path
