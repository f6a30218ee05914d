"""The twin's launches seat an attempt on only the nodes that changed: the same attempts per node, the
same broken nodes and the same kills, in the same order, as a pass over every rank."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from simulator import twin
from simulator.failures import Cause, Fault, Signal
from simulator.launches import Launches
from simulator.scenario import load_scenario
from simulator.world import Attempt, SimJob, SimNode, changed_ranks

NODES = [f"n{i}" for i in range(12)]
JOBS = ["a", "b", "c"]
_XID = Signal(xids=(79,))
_SLOW = Signal(speed_ratio=0.5)  # a fault that does not block a launch
_CAUSE = Cause("test", "test", "hardware", 0.0, (), kills_job=True, hang=False)

# one step: ("start", job, gang) | ("exit", job) | ("down", node) | ("fault", node, blocks)
#           | ("fix", node) | ("delete", node)
_gang = st.lists(st.sampled_from([*NODES, "ghost"]), min_size=1, max_size=8, unique=True)
_step = st.one_of(
    st.tuples(st.just("start"), st.sampled_from(JOBS), _gang),
    st.tuples(st.just("exit"), st.sampled_from(JOBS)),
    st.tuples(st.just("down"), st.sampled_from(NODES)),
    st.tuples(st.just("fault"), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("fix"), st.sampled_from(NODES)),
    st.tuples(st.just("delete"), st.sampled_from(NODES)),
)


def _launches() -> Launches:
    sc = load_scenario(None, {"duration": "1h"})
    launches = twin.Twin(sc).compute.launches
    launches.fleet.nodes.clear()
    for i, nid in enumerate(NODES):
        launches.fleet.nodes[nid] = SimNode(nid, "train", i, 1.0, up=True)
    return launches


def _none(att: Attempt | None) -> bool:
    return att is None or not att.alive or att.exited


class _Reference:
    """The pass over every rank that ``_seat`` replaced, on its own table of attempts."""

    def __init__(self) -> None:
        self.attempt: dict[str, Attempt] = {}

    def seat(self, launches: Launches, att: Attempt) -> tuple[list[Any], list[Attempt]]:
        broken: list[Any] = []
        kills: list[Attempt] = []
        for nid in att.node_ids:
            node = launches.fleet.nodes.get(nid)
            if node is None or node.deleted or not node.up:
                broken.append((nid, None))
                continue
            prev = self.attempt.get(nid)
            if prev is not None and prev.alive and not prev.exited and prev is not att \
                    and prev not in kills:
                kills.append(prev)
            self.attempt[nid] = att
            if node.fault is not None and node.fault.signal.blocks_launch:
                broken.append((nid, node.fault))
        return broken, kills


# a shortcut for at most 2 changed nodes (small gangs take it and the full pass both), and
# for up to 64 (every restart whose old attempt is over takes it)
@pytest.mark.slow
@pytest.mark.parametrize("reseat_all_over", [2, 64])
@settings(max_examples=250, deadline=None)
@given(steps=st.lists(_step, min_size=1, max_size=30))
def test_seats_match_a_pass_over_every_rank(reseat_all_over: int,
                                            steps: list[tuple[Any, ...]]) -> None:
    note(f"steps: {steps}")
    launches = _launches()
    fleet = launches.fleet
    launches.RESEAT_ALL_OVER = reseat_all_over
    ref = _Reference()
    jobs = {name: SimJob(None, name) for name in JOBS}  # type: ignore[arg-type]
    killed: list[Attempt] = []

    def kill(att: Attempt, t: float, cause: str, *, hang: bool) -> None:
        if att.alive and not att.exited:
            att.alive = False
            killed.append(att)

    launches.job_model.kill = kill  # type: ignore[method-assign]
    numbers = dict.fromkeys(JOBS, 0)
    for step in steps:
        kind = step[0]
        if kind == "start":
            job = jobs[step[1]]
            numbers[job.job_id] += 1
            ids = tuple(step[2])
            att = Attempt(job, numbers[job.job_id], ids, 0.0, 0.0, 0)
            want_broken, want_kills = ref.seat(launches, att)
            old, job.attempt = job.attempt, att
            del killed[:]
            assert launches.seat(job, old, att, 0.0) == want_broken
            assert killed == want_kills
        elif kind == "exit":
            att = jobs[step[1]].attempt
            if att is not None:
                att.exited, att.alive = True, False
        else:
            node = fleet.nodes[step[1]]
            if kind == "down":
                node.up = False
            elif kind == "fault":
                node.fault = Fault(_CAUSE, _XID if step[2] else _SLOW, "reboot", 0.0)
            elif kind == "fix":
                node.fault, node.up = None, not node.deleted
            else:
                node.deleted, node.up = True, False
            fleet.fitness_changed(node)
        for job in jobs.values():  # the gang kept up to date is the latest attempt's nodes
            assert job.gang == (set(job.attempt.node_ids) if job.attempt else set())
        for nid, node in fleet.nodes.items():
            mine, theirs = node.attempt, ref.attempt.get(nid)
            assert mine is theirs or (_none(mine) and _none(theirs)), nid
        assert fleet.unfit == {nid for nid, n in fleet.nodes.items() if n.deleted or not n.up
                                 or (n.fault is not None and n.fault.signal.blocks_launch)}


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 300), changes=st.lists(st.integers(0, 299), max_size=12),
       limit=st.integers(0, 16))
def test_changed_ranks_are_the_ranks_that_differ(size: int, changes: list[int],
                                                 limit: int) -> None:
    old = tuple(f"n{i}" for i in range(size))
    new = list(old)
    for i in changes:
        if i < size:
            new[i] = f"m{i}"
    want = [i for i in range(size) if old[i] != new[i]]
    got = changed_ranks(old, tuple(new), limit)
    assert got == (want if len(want) <= limit else None)
