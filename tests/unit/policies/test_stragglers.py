"""A straggler's action by expected cost (shared.policies.stragglers): table-driven."""

from __future__ import annotations

import pytest

from shared.policies.recovery import Capacity, JobCosts, Mode, Tier, TierCost
from shared.policies.stragglers import StragglerConfig, decide, remaining_s, slowdown_s

MEM = TierCost(Tier.MEMORY, restore_s=2.0, lost_s=5.0)
PEER = TierCost(Tier.PEER, restore_s=10.0, lost_s=20.0)
DUR = TierCost(Tier.DURABLE, restore_s=60.0, lost_s=600.0)
TIERED = JobCosts(step_s=1.0, startup_cold_s=90.0, startup_warm_s=10.0, tiers=(MEM, PEER, DUR))
DURABLE = JobCosts(step_s=1.0, startup_cold_s=90.0, startup_warm_s=10.0, tiers=(DUR,))
SPARE = Capacity(4, None, 1, None, 3600.0)
NO_SPARE = Capacity(4, None, 0, None, 3600.0)
CFG = StragglerConfig(act_margin=0.25, keep_margin=0.0, horizon_s=14400.0)

# ratio, remaining s, costs, capacity, previous -> swap?, mode, swap s
# (hot swap with a spare and a peer entry: max(90 + 10, 10 + 2) + 20 = 120 s; with no
# spare only a requeue: 90 + 60 + 600 + the 3600 s repair wait = 4350 s)
CASES = [
    ("1.5x, an hour left: the swap pays", 1.5, 3600.0, TIERED, SPARE, False, True,
     Mode.HOT_SWAP, 120.0),
    ("1.12x, ten minutes left: 64 s lost < 1.25 x 120", 1.12, 600.0, TIERED, SPARE, False,
     False, Mode.HOT_SWAP, 120.0),
    ("1.12x, four hours left: 1543 s lost", 1.12, 14400.0, TIERED, SPARE, False, True,
     Mode.HOT_SWAP, 120.0),
    ("2x, 200 s left: the job ends before a swap pays", 2.0, 200.0, TIERED, SPARE, False,
     False, Mode.HOT_SWAP, 120.0),
    ("1.5x, no spare, an hour: 1200 s < the requeue's 4350 s", 1.5, 3600.0, DURABLE,
     NO_SPARE, False, False, Mode.REQUEUE, 4350.0),
    ("1.5x, no spare, four hours: 4800 s < 1.25 x 4350", 1.5, 14400.0, DURABLE, NO_SPARE,
     False, False, Mode.REQUEUE, 4350.0),
    ("2x, no spare, four hours: 7200 s >= 1.25 x 4350", 2.0, 14400.0, DURABLE, NO_SPARE,
     False, True, Mode.REQUEUE, 4350.0),
    # hysteresis: 1.3x over 560 s loses 129 s: above the swap, under 1.25 x the swap
    ("near the boundary, first verdict: wait", 1.3, 560.0, TIERED, SPARE, False, False,
     Mode.HOT_SWAP, 120.0),
    ("near the boundary, a swap chosen: kept", 1.3, 560.0, TIERED, SPARE, True, True,
     Mode.HOT_SWAP, 120.0),
    ("a swap chosen, the slowdown now cheaper than the swap: dropped", 1.3, 400.0, TIERED,
     SPARE, True, False, Mode.HOT_SWAP, 120.0),
    ("no slower than its peers: never", 1.0, 14400.0, TIERED, SPARE, True, False,
     Mode.HOT_SWAP, 120.0),
]


@pytest.mark.parametrize(("name", "ratio", "remaining", "costs", "capacity", "previous",
                          "swap", "mode", "swap_s"), CASES, ids=[c[0] for c in CASES])
def test_table(name: str, ratio: float, remaining: float, costs: JobCosts, capacity: Capacity,
               previous: bool, swap: bool, mode: Mode, swap_s: float) -> None:
    verdict = decide(ratio, remaining, "n1", costs, capacity, previous, CFG)
    assert (verdict.swap, verdict.mode, verdict.swap_s) == (swap, mode, swap_s), verdict.why
    assert verdict.slowdown_s == pytest.approx(slowdown_s(ratio, remaining))
    assert verdict.why.startswith("swap" if swap else "wait")


@pytest.mark.parametrize(("ratio", "remaining", "lost"), [
    (1.5, 3600.0, 1200.0), (2.0, 100.0, 50.0), (1.0, 3600.0, 0.0), (0.8, 3600.0, 0.0),
    (1.5, 0.0, 0.0)])
def test_slowdown_is_the_progress_lost(ratio: float, remaining: float, lost: float) -> None:
    assert slowdown_s(ratio, remaining) == pytest.approx(lost)


@pytest.mark.parametrize(("started", "timeout", "left"), [
    (1000.0, 3600.0, 3100.0),  # to the deadline
    (1000.0, 100.0, 0.0),  # past it: nothing left
    (1000.0, None, 14400.0),  # no deadline: the horizon
    (None, 3600.0, 14400.0),  # not started: the horizon
])
def test_remaining(started: float | None, timeout: float | None, left: float) -> None:
    assert remaining_s(1500.0, started, timeout, CFG) == left
