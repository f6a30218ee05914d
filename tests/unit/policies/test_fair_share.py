"""Fair share: quotas, borrowing, reclaim by preemption, queue positions and wait reasons."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.policies.fair_share import (
    DEFAULT_TEAM,
    PREEMPTION,
    QueuedJob,
    Quota,
    RunningJob,
    decide,
)

P = "gpu"
QUOTAS = (Quota("a", P, 2), Quota("b", P, 2))
CAP = {P: 4}


def run(job_id: str, team: str, nodes: int, priority: int = 0, at: float = 0.0,
        stopping: bool = False) -> RunningJob:
    return RunningJob(job_id, team, P, nodes, priority, at, stopping)


def wait(job_id: str, team: str, nodes: int, priority: int = 0, at: float = 0.0) -> QueuedJob:
    return QueuedJob(job_id, team, P, nodes, priority, at)


@pytest.mark.parametrize(("running", "queued", "admitted", "preempted"), [
    # idle quota of b is borrowed by a
    ((), (wait("a1", "a", 4),), ("a1",), ()),
    # b comes back for its quota: a's borrowing job is preempted
    ((run("a1", "a", 4),), (wait("b1", "b", 2),), (), ("a1",)),
    # a within its own quota is never preempted
    ((run("a1", "a", 2), run("b0", "b", 2)), (wait("b1", "b", 2),), (), ()),
    # lowest priority first, then newest: a3 (prio 0, newer) before a2 (prio 0, older)
    ((run("a1", "a", 2, 5), run("a2", "a", 1, 0, 1.0), run("a3", "a", 1, 0, 2.0)),
     (wait("b1", "b", 1),), (), ("a3",)),
    # preempting only as long as the victim team borrows: a2's team stops borrowing
    ((run("a1", "a", 2, 5), run("a2", "a", 2, 0, 1.0)), (wait("b1", "b", 2),), (), ("a2",)),
    # the fewest victims: a-small was taken first, but a-big alone makes room
    ((run("a-small", "a", 1, 0, 2.0), run("a-big", "a", 3, 1, 1.0)), (wait("b1", "b", 2),),
     (), ("a-big",)),
    # a job over its team's quota does not preempt: it waits to borrow
    ((run("a1", "a", 4),), (wait("b1", "b", 3),), (), ()),
    # the default queue has no quota: what it runs is borrowed
    ((run("a1", "a", 2), run("x", DEFAULT_TEAM, 1)), (wait("b1", "b", 2),), (), ("x",)),
    # already stopping: its nodes are counted as coming back, nobody else is asked
    ((run("a1", "a", 2, at=1.0, stopping=True), run("a2", "a", 2, at=2.0)),
     (wait("b1", "b", 2),), (), ()),
])
def test_decisions(running: tuple[RunningJob, ...], queued: tuple[QueuedJob, ...],
                   admitted: tuple[str, ...], preempted: tuple[str, ...]) -> None:
    d = decide(QUOTAS, CAP, running, queued, 0.0)
    assert d.admitted == admitted
    assert tuple(j for j, _ in d.preempt) == preempted
    for _, reason in d.preempt:
        assert reason.startswith(f"{PREEMPTION}:")


def test_borrowing_limit_and_reasons() -> None:
    quotas = (Quota("a", P, 1, borrowing_limit=1), Quota("b", P, 3))
    d = decide(quotas, CAP, (), (wait("a1", "a", 3), wait("a2", "a", 2, at=1.0)), 0.0)
    assert d.admitted == ("a2",)
    assert "over quota" in d.waits["a1"].reason
    assert d.waits["a1"].position == 1 and d.waits["a2"].position == 2
    assert d.waits["a2"].reason == ""


def test_reclaiming_job_reserves_the_nodes_it_freed() -> None:
    d = decide(QUOTAS, CAP, (run("a1", "a", 4),),
               (wait("b1", "b", 2), wait("x", DEFAULT_TEAM, 3, priority=9)), 0.0)
    assert [j for j, _ in d.preempt] == ["a1"]
    assert d.waits["b1"].reason.startswith("reclaiming quota")
    assert d.waits["x"].reason.startswith("waiting to borrow")  # b's nodes are not lent


def test_default_queue_only_borrows() -> None:
    d = decide(QUOTAS, CAP, (run("x", DEFAULT_TEAM, 3),), (wait("a1", "a", 2),), 0.0)
    assert [j for j, _ in d.preempt] == ["x"]


teams = st.sampled_from(["a", "b", "c", DEFAULT_TEAM])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Quota], int, list[RunningJob], list[QueuedJob]]:
    quotas = [Quota(t, P, draw(st.integers(0, 4)),
                    draw(st.one_of(st.none(), st.integers(0, 4)))) for t in ("a", "b", "c")]
    n_running = draw(st.integers(0, 6))
    running = [run(f"r{i}", draw(teams), draw(st.integers(1, 3)), draw(st.integers(0, 2)),
                   float(draw(st.integers(0, 9))), draw(st.booleans()))
               for i in range(n_running)]
    cap = sum(r.nodes for r in running) + draw(st.integers(0, 4))
    queued = [wait(f"q{i}", draw(teams), draw(st.integers(1, 4)), draw(st.integers(0, 2)),
                   float(draw(st.integers(0, 9)))) for i in range(draw(st.integers(0, 5)))]
    return quotas, cap, running, queued


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_team_within_its_quota_is_never_preempted(
        world: tuple[list[Quota], int, list[RunningJob], list[QueuedJob]]) -> None:
    quotas, cap, running, queued = world
    d = decide(quotas, {P: cap}, running, queued, 0.0)
    nominal = {q.team: q.nominal for q in quotas}
    use: dict[str, int] = {}
    for r in running:
        use[r.team] = use.get(r.team, 0) + r.nodes
    by_id = {r.job_id: r for r in running}
    for job_id, _ in d.preempt:
        victim = by_id[job_id]
        assert use[victim.team] > nominal.get(victim.team, 0)
        assert not victim.stopping


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_borrowed_capacity_is_always_reclaimable(
        world: tuple[list[Quota], int, list[RunningJob], list[QueuedJob]]) -> None:
    """A team whose job fits in its unused nominal quota gets it: either the job is admitted,
    or enough borrowers' jobs are (being) stopped for it."""
    quotas, cap, running, _ = world
    nominal = {q.team: q.nominal for q in quotas}
    cap = max(cap, sum(nominal.values()))
    use = {t: sum(r.nodes for r in running if r.team == t) for t in nominal}
    team = "a"
    room = nominal[team] - use[team]
    if room <= 0 or sum(r.nodes for r in running) > cap:
        return
    d = decide(quotas, {P: cap}, running, [wait("new", team, room, priority=9)], 0.0)
    assert "new" in d.admitted or d.waits["new"].reason.startswith("reclaiming quota")
