"""Which announced attempt facts are re-announced: only what the store is still missing, never
a stale one, once per fact however many copies, in any order, within the bounds."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.policies.reconcile import (
    EXIT,
    FIRST_STEP,
    Announced,
    JobView,
    Limits,
    Verdict,
    due_at,
    missing,
    plan,
)

LIMITS = Limits(settle_s=60.0, max_gap_s=600.0, per_pass=3, horizon_s=86_400.0)


def exit_of(attempt: int = 2, job: str = "j1", at: float = 0.0, event_id: str = "",
            sends: int = 1, last_sent: float | None = None) -> Announced:
    return Announced(event_id or f"{job}-{attempt}-{at}", EXIT, job, attempt, at, sends,
                     last_sent)


@pytest.mark.parametrize(("kind", "view", "verdict"), [
    (EXIT, JobView("j1", 2), Verdict.RESEND),  # RUNNING at that attempt: the exit is missing
    (EXIT, JobView("j1", 2, running=False), Verdict.SETTLED),  # requeued: recorded
    (EXIT, JobView("j1", 2, terminal=True, running=False), Verdict.SETTLED),
    (EXIT, JobView("j1", 3), Verdict.SETTLED),  # moved past: stale, must not end attempt 3
    (EXIT, JobView("j1", 1), Verdict.WAIT),  # its start not recorded yet
    (EXIT, None, Verdict.SETTLED),  # the job is gone
    (FIRST_STEP, JobView("j1", 2, first_step_of=1), Verdict.RESEND),
    (FIRST_STEP, JobView("j1", 2, first_step_of=2), Verdict.SETTLED),
    (FIRST_STEP, JobView("j1", 2, running=False), Verdict.SETTLED),
    (FIRST_STEP, JobView("j1", 3), Verdict.SETTLED),
    ("mtc.job.checkpoint_saved.v1", JobView("j1", 2), Verdict.SETTLED),  # not watched
])
def test_what_the_store_is_missing(kind: str, view: JobView | None, verdict: Verdict) -> None:
    assert missing(Announced("e", kind, "j1", 2, 0.0), view) is verdict


def test_first_resend_after_settle_then_a_doubling_gap_up_to_the_cap() -> None:
    assert due_at(exit_of(at=100.0), LIMITS) == 160.0
    assert due_at(exit_of(at=100.0, sends=2, last_sent=160.0), LIMITS) == 280.0
    assert due_at(exit_of(at=100.0, sends=3, last_sent=280.0), LIMITS) == 520.0
    assert due_at(exit_of(at=100.0, sends=9, last_sent=5000.0), LIMITS) == 5600.0


def test_a_lost_exit_is_resent_once_due_and_not_before() -> None:
    fact = exit_of(at=100.0)
    views = {"j1": JobView("j1", 2)}
    assert plan([fact], views, 159.0, LIMITS).resend == ()
    assert plan([fact], views, 160.0, LIMITS).resend == (fact,)


def test_copies_of_one_exit_are_sent_once_the_oldest() -> None:
    old, young = exit_of(at=10.0, event_id="b"), exit_of(at=20.0, event_id="a")
    decided = plan([young, old], {"j1": JobView("j1", 2)}, 1000.0, LIMITS)
    assert decided.resend == (old,) and decided.settled == ()  # the copy waits, kept


def test_an_exit_of_an_attempt_the_job_moved_past_is_forgotten_not_sent() -> None:
    stale, live = exit_of(attempt=1, at=10.0), exit_of(attempt=2, at=20.0)
    decided = plan([stale, live], {"j1": JobView("j1", 2)}, 1000.0, LIMITS)
    assert decided.resend == (live,) and decided.settled == (stale,)


def test_at_most_per_pass_oldest_first_and_old_ones_given_up() -> None:
    facts = [exit_of(job=f"j{i}", at=float(i)) for i in range(5)]
    views = {f.job_id: JobView(f.job_id, 2) for f in facts}
    decided = plan(reversed(facts), views, 1000.0, LIMITS)
    assert decided.resend == tuple(facts[:3])
    expired = plan(facts, views, 90_000.0, LIMITS)
    assert expired.resend == () and expired.expired == tuple(facts)


facts_st = st.lists(st.tuples(
    st.sampled_from([EXIT, FIRST_STEP]), st.sampled_from(["j1", "j2", "j3"]),
    st.integers(1, 4), st.floats(0, 2000), st.integers(1, 6), st.none() | st.floats(0, 3000),
), max_size=12).map(lambda rows: [Announced(f"e{i}", *row) for i, row in enumerate(rows)])
views_st = st.dictionaries(st.sampled_from(["j1", "j2", "j3"]), st.builds(
    JobView, job_id=st.just(""), attempt=st.integers(1, 4), terminal=st.booleans(),
    running=st.booleans(), first_step_of=st.integers(0, 4)))


@settings(suppress_health_check=[HealthCheck.too_slow])  # a loaded machine, not the policy
@given(facts_st, views_st, st.floats(0, 5000), st.randoms(use_true_random=False))
def test_never_stale_once_per_fact_bounded_and_order_free(
        facts: list[Announced], views: dict[str, JobView], now: float, rng: random.Random
) -> None:
    decided = plan(facts, views, now, LIMITS)
    for fact in decided.resend:
        view = views[fact.job_id]
        assert not view.terminal and view.running and view.attempt == fact.attempt
        assert now >= due_at(fact, LIMITS)
    assert len({f.key for f in decided.resend}) == len(decided.resend) <= LIMITS.per_pass
    ids = [f.event_id for f in decided.resend + decided.settled + decided.expired]
    assert len(ids) == len(set(ids))
    shuffled = list(facts)
    rng.shuffle(shuffled)
    assert plan(shuffled, views, now, LIMITS) == decided  # the order they are read in: none
