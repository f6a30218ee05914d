"""The hang and straggler policy (shared.policies.hangs): table-driven, time passed in; the
straggler score over timings recorded from a real 4-rank gloo run on a loaded machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.policies.hangs import (
    HangConfig,
    RankState,
    SlowConfig,
    judge,
    program_fault,
    scores,
    slow_in_job,
    threshold,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "rank_progress"
CFG = HangConfig(factor=3.0, floor_s=1.0, ceiling_s=600.0, min_steps=5, stale_beats=3.0)
NOW = 1000.0


@pytest.mark.parametrize(("times", "expected"), [
    ([0.1] * 4, 600.0),  # too few steps timed: the ceiling
    ([0.1] * 99 + [2.0], 1.0),  # one outlier in 100 is above the p99: 3 x 0.1, floored
    ([0.1] * 98 + [2.0, 2.0], 6.0),  # two are the p99: 3 x 2.0
    ([0.01] * 50, 1.0),  # the floor
    ([500.0] * 50, 600.0),  # the ceiling
])
def test_threshold_is_k_times_p99_clamped(times: list[float], expected: float) -> None:
    assert threshold(times, CFG) == pytest.approx(expected)


def rank(r: int, seq: int, inside: bool, *, step: int = 10, beat_age: float = 0.1,
         progress_age: float = 20.0) -> RankState:
    return RankState(rank=r, step=step, seq=seq, inside=inside, collective="all_reduce",
                     progress_at=NOW - progress_age, beat_at=NOW - beat_age, beat_every_s=0.5)


STEPS = [1.0] * 20  # threshold 3 s


@pytest.mark.parametrize(("name", "ranks", "culprit"), [
    ("rank 2 never entered the all-reduce the others wait in",
     [rank(0, 11, True), rank(1, 11, True), rank(2, 10, False, beat_age=30), rank(3, 11, True)],
     2),
    ("the one behind is named even while alive (stuck in its own compute)",
     [rank(0, 11, True), rank(1, 10, False), rank(2, 11, True), rank(3, 11, True)], 1),
    ("all inside the same one: the rank whose heartbeat stopped inside it",
     [rank(0, 11, True), rank(1, 11, True), rank(2, 11, True), rank(3, 11, True, beat_age=9)],
     3),
    ("all alive, all waiting in the same one: the program's own hang",
     [rank(0, 11, True), rank(1, 11, True)], None),
    ("no collectives reported, one stopped",
     [rank(0, 0, False), rank(1, 0, False, beat_age=5)], 1),
    ("two behind: the stopped one of them",
     [rank(0, 12, True), rank(1, 11, False), rank(2, 11, False, beat_age=5)], 2),
])
def test_culprit(name: str, ranks: list[RankState], culprit: int | None) -> None:
    hang = judge(ranks, STEPS, NOW, CFG)
    assert hang is not None, name
    assert hang.culprit == culprit, (name, hang.evidence)
    assert hang.threshold_s == pytest.approx(3.0) and hang.silent_s == pytest.approx(20.0)


def test_no_hang_while_any_rank_progresses_within_the_threshold() -> None:
    ranks = [rank(0, 11, True), rank(1, 10, False, progress_age=2.9)]
    assert judge(ranks, STEPS, NOW, CFG) is None
    assert judge([rank(0, 11, True, progress_age=3.1)], STEPS, NOW, CFG) is not None
    assert judge([], STEPS, NOW, CFG) is None


@pytest.mark.parametrize(("before", "node", "fault"), [
    ([], "n1", False), (["n1"], "n1", False), (["n1"], "n2", True), (["n1", "n1"], "n3", True),
])
def test_a_hang_again_on_another_node_is_the_programs(before: list[str], node: str,
                                                      fault: bool) -> None:
    assert program_fault(before, node) is fault


# ---------------------------------------------------------------- stragglers

SLOW = SlowConfig()


def recorded(name: str) -> dict[int, list[tuple[int, float]]]:
    data = json.loads((FIXTURES / name).read_text())
    return {int(r): [(int(s), float(c)) for s, c, _ in rows] for r, rows in data["ranks"].items()}


def test_recorded_noisy_timings_never_give_slow_in_job() -> None:
    timings = recorded("noisy_4ranks.json")
    # every window of the run, as the adapter would score it scan after scan
    for end in range(SLOW.min_steps + SLOW.warmup_steps, 61):
        cut = {r: [x for x in rows if x[0] <= end] for r, rows in timings.items()}
        for r, score in scores(cut, SLOW).items():
            assert not slow_in_job(False, score, SLOW), (end, r, score)


def test_a_rank_slowed_30_percent_gets_slow_in_job() -> None:
    found = scores(recorded("slow_rank2_4ranks.json"), SLOW)
    assert found[2] >= 1 + SLOW.margin
    assert [r for r, s in found.items() if slow_in_job(False, s, SLOW)] == [2]


def test_checkpoint_and_warmup_steps_slow_every_rank_alike() -> None:
    base = {r: [(s, 0.1) for s in range(1, 41)] for r in range(4)}
    base[1] = [(s, 0.13) for s in range(1, 41)]
    spiky = {r: [(s, c * (20 if s % 10 == 0 or s <= 2 else 1)) for s, c in rows]
             for r, rows in base.items()}
    assert scores(spiky, SLOW) == pytest.approx(scores(base, SLOW))
    assert scores(spiky, SLOW)[1] == pytest.approx(1.3)


@pytest.mark.parametrize(("was", "score", "now"), [
    (False, 1.11, False), (False, 1.12, True), (True, 1.07, True), (True, 1.05, False),
    (True, None, True), (False, None, False),
])
def test_slow_in_job_hysteresis(was: bool, score: float | None, now: bool) -> None:
    assert slow_in_job(was, score, SLOW) is now


def test_too_few_steps_or_ranks_give_no_score() -> None:
    assert scores({0: [(s, 0.1) for s in range(50)]}, SLOW) == {}
    assert scores({0: [(1, 0.1)], 1: [(1, 0.5)]}, SLOW) == {}
