"""The straggler draw through a Fenwick tree picks what the list of the whole fleet picked."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import twin
from simulator.picking import Qualifying
from simulator.scenario import SCENARIO_DIR, load_scenario
from simulator.stragglers import Stragglers

# ("append", qualifies) | ("set", position, qualifies), positions taken modulo the length
_op = st.one_of(st.tuples(st.just("append"), st.booleans()),
                st.tuples(st.just("set"), st.integers(0, 1000), st.booleans()))


@given(st.lists(_op, max_size=200))
def test_kth_is_the_kth_of_the_list(ops: list[tuple[Any, ...]]) -> None:
    q, flags = Qualifying(), list[bool]()
    for op in ops:
        if op[0] == "append" or not flags:
            assert q.append(op[-1]) == len(flags)
            flags.append(op[-1])
        else:
            at = op[1] % len(flags)
            q.set(at, op[2])
            flags[at] = op[2]
        listed = [i for i, f in enumerate(flags) if f]
        assert (len(q), q.count) == (len(flags), len(listed))
        assert [q.kth(k) for k in range(q.count)] == listed
    with pytest.raises(IndexError):
        q.kth(q.count)


def _listed_draw(self: Stragglers) -> Any:
    """The draw as it was: a list of every node that may straggle, built for each draw."""
    fleet = self.fleet
    candidates = [n for n in fleet.nodes.values()
                  if n.up and not n.deleted and n.node_id not in fleet.stragglers and n.partition]
    if not candidates:
        return None
    return candidates[int(fleet.rng.integers(len(candidates)))]


@pytest.mark.slow
def test_a_run_with_many_stragglers_draws_the_same_nodes(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    # many stragglers and faults (nodes deleted and replaced) in a short run of small.yaml
    sc = load_scenario(SCENARIO_DIR / "small.yaml",
                       {"duration": "4d", "failures.stragglers.per_1000_node_days": 400})
    tree = twin.Twin(sc)
    fast = tree.run()
    monkeypatch.setattr(Stragglers, "draw", _listed_draw)
    listed = twin.Twin(sc)
    slow = listed.run()
    drawn = [e for e in tree.fleet.timeline if e[1] == "straggler"]
    assert len(drawn) > 20
    assert drawn == [e for e in listed.fleet.timeline if e[1] == "straggler"]
    assert tree.fleet.timeline == listed.fleet.timeline
    assert fast.events == slow.events
