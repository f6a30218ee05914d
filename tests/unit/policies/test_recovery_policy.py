"""The recovery policy: the cheapest allowed mode, a pin where allowed, and why."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.policies.recovery import (
    Capacity,
    Decision,
    Incident,
    IncidentKind,
    JobCosts,
    Mode,
    Tier,
    TierCost,
    choose,
    pin_of,
)

APP = Incident(IncidentKind.APP_RESTART, ("n1",))
REPAIR = Incident(IncidentKind.NODE_REPAIR, ("n1",))
LOST = Incident(IncidentKind.NODE_LOST, ("n1",))

MEM = TierCost(Tier.MEMORY, restore_s=2.0, lost_s=5.0)
PEER = TierCost(Tier.PEER, restore_s=10.0, lost_s=20.0)
DUR = TierCost(Tier.DURABLE, restore_s=60.0, lost_s=600.0)

ALL_TIERS = JobCosts(step_s=1.0, startup_cold_s=90.0, startup_warm_s=10.0,
                     tiers=(MEM, PEER, DUR))
DURABLE_ONLY = JobCosts(step_s=1.0, startup_cold_s=90.0, startup_warm_s=10.0, tiers=(DUR,))
NOTHING = JobCosts(step_s=1.0, startup_cold_s=90.0, startup_warm_s=10.0, tiers=())


def cap(replicas: int = 4, min_replicas: int | None = None, spares: int = 0,
        spare_eta: float | None = None, repair_eta: float = 3600.0) -> Capacity:
    return Capacity(replicas, min_replicas, spares, spare_eta, repair_eta)


# incident, costs, capacity, pinned -> mode, expected seconds of that mode
CASES = [
    # the nodes stay usable and tier 1 exists: in place, warm + memory + lost
    ("app, tiers", APP, ALL_TIERS, cap(), None, Mode.IN_PLACE, 10 + 2 + 5),
    # no tier 1: today's requeue (cold + durable restore + durable lost, no wait)
    ("app, durable only", APP, DURABLE_ONLY, cap(), None, Mode.REQUEUE, 90 + 60 + 600),
    # a node leaves with a spare ready: hot swap, the gang waits for the cold spare
    ("repair, spare", REPAIR, ALL_TIERS, cap(spares=1), None, Mode.HOT_SWAP,
     max(90 + 10, 10 + 2) + 20),
    ("lost, spare", LOST, ALL_TIERS, cap(spares=2), None, Mode.HOT_SWAP, 100 + 20),
    # a spare but no peer copy: requeue, and it waits for nothing (the spare is ready)
    ("repair, spare, durable only", REPAIR, DURABLE_ONLY, cap(spares=1), None, Mode.REQUEUE,
     90 + 60 + 600),
    # no spare, not elastic: requeue and wait for the repair
    ("repair, no spare", REPAIR, ALL_TIERS, cap(), None, Mode.REQUEUE, 90 + 60 + 600 + 3600),
    # no spare, a spare expected: the wait is the spare's eta
    ("repair, spare eta", REPAIR, ALL_TIERS, cap(spare_eta=300.0), None, Mode.REQUEUE,
     90 + 60 + 600 + 300),
    # elastic, no spare: scale down, memory restore + 1/4 of the repair eta given up
    ("elastic, no spare", REPAIR, ALL_TIERS, cap(min_replicas=2), None, Mode.SCALE_DOWN,
     10 + 2 + 5 + 3600 / 4),
    # elastic but already at its minimum: requeue
    ("elastic at min", REPAIR, ALL_TIERS, cap(replicas=2, min_replicas=2), None, Mode.REQUEUE,
     90 + 60 + 600 + 3600),
    # elastic with a spare ready: hot swap (shrinking would only cost a regrow)
    ("elastic, spare", REPAIR, ALL_TIERS, cap(min_replicas=2, spares=1, spare_eta=0.0), None,
     Mode.HOT_SWAP, 120),
    # elastic, durable only, spare expected soon: scale down from durable still beats waiting
    ("elastic durable", LOST, DURABLE_ONLY, cap(min_replicas=1, spare_eta=400.0), None,
     Mode.SCALE_DOWN, 10 + 60 + 600 + 100),
    # pins: allowed wins even when dearer; not allowed falls back
    ("pin requeue", APP, ALL_TIERS, cap(), Mode.REQUEUE, Mode.REQUEUE, 90 + 60 + 600),
    ("pin in place on a lost node", LOST, ALL_TIERS, cap(spares=1), Mode.IN_PLACE,
     Mode.HOT_SWAP, 120),
    # nothing measured at all: requeue from the start
    ("nothing", APP, NOTHING, cap(), None, Mode.REQUEUE, 90),
]


@pytest.mark.parametrize(("name", "incident", "costs", "capacity", "pinned", "mode", "seconds"),
                         CASES, ids=[c[0] for c in CASES])
def test_table(name: str, incident: Incident, costs: JobCosts, capacity: Capacity,
               pinned: Mode | None, mode: Mode, seconds: float) -> None:
    d = choose(incident, costs, capacity, pinned)
    assert d.mode is mode, d.why
    assert d.expected() == pytest.approx(seconds)
    assert d.why.startswith(("pinned", str(mode))) and f"{seconds:.1f}s" in d.why


def test_a_refused_pin_says_so() -> None:
    d = choose(LOST, ALL_TIERS, cap(spares=1), Mode.IN_PLACE)
    assert "pinned in_place not allowed" in d.why and "fell back" in d.why


def test_not_allowed_modes_are_named_with_the_reason() -> None:
    d = choose(REPAIR, DURABLE_ONLY, cap(), None)
    assert "hot_swap not allowed: 0 spare(s) ready" in d.why
    assert "scale_down not allowed: the job is not elastic" in d.why
    assert [m for m, _ in d.expected_lost_s] == [Mode.REQUEUE]


def test_pins_from_labels() -> None:
    assert pin_of(None, "Hot_Swap") is Mode.HOT_SWAP
    assert pin_of("in_place", "requeue") is Mode.IN_PLACE
    assert pin_of("nonsense", "") is None


seconds = st.floats(min_value=0.0, max_value=1e5, allow_nan=False)
lost = st.one_of(seconds, st.just(math.inf))


@st.composite
def situations(draw: st.DrawFn) -> tuple[Incident, JobCosts, Capacity]:
    kind = draw(st.sampled_from(list(IncidentKind)))
    tiers = tuple(TierCost(t, draw(seconds), draw(lost))
                  for t in Tier if draw(st.booleans()))
    costs = JobCosts(1.0, draw(seconds), draw(seconds), tiers)
    replicas = draw(st.integers(1, 8))
    capacity = Capacity(replicas, draw(st.one_of(st.none(), st.integers(1, 8))),
                        draw(st.integers(0, 3)), draw(st.one_of(st.none(), seconds)),
                        draw(seconds))
    return Incident(kind, ("n1",)), costs, capacity


@given(situations(), st.one_of(st.none(), st.sampled_from(list(Mode))))
def test_properties(situation: tuple[Incident, JobCosts, Capacity], pinned: Mode | None
                    ) -> None:
    incident, costs, capacity = situation
    d: Decision = choose(incident, costs, capacity, pinned)
    allowed = dict(d.expected_lost_s)
    assert Mode.REQUEUE in allowed  # the fallback is always there
    assert d.mode in allowed
    if pinned is not None and pinned in allowed:
        assert d.mode is pinned
    elif math.isfinite(min(allowed.values())):
        assert allowed[d.mode] == min(allowed.values())  # the cheapest
    if incident.kind is not IncidentKind.APP_RESTART:
        assert Mode.IN_PLACE not in allowed  # a node that leaves is never reused
    else:
        assert Mode.HOT_SWAP not in allowed and Mode.SCALE_DOWN not in allowed
    if capacity.min_replicas is None:
        assert Mode.SCALE_DOWN not in allowed
    if capacity.min_replicas is None and all(t.tier is Tier.DURABLE for t in costs.tiers):
        assert d.mode is Mode.REQUEUE or pinned is Mode.REQUEUE  # the plain requeue
    if capacity.spares_ready >= 1:
        assert Mode.SCALE_DOWN not in allowed
