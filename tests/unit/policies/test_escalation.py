"""The escalation ladder as a table: rungs climb with restarts that made no progress."""

from __future__ import annotations

import pytest

from shared.domain.errors import ValidationError
from shared.policies.escalation import LadderConfig, next_step, rung_of
from shared.policies.recovery import Mode, Tier

LADDER = LadderConfig(in_place=1, hot_swap=1, requeue=2)


@pytest.mark.parametrize(("stalled", "rung"), [
    ([], 0), ([0], 1), ([0, 1], 2), ([0, 1, 2], 2), ([0, 1, 2, 2], None),
])
def test_the_rung_climbs_with_each_restart_without_progress(stalled: list[int],
                                                            rung: int | None) -> None:
    assert rung_of(stalled, LADDER) == rung


def test_each_rung_bars_the_modes_and_tiers_before_it() -> None:
    assert next_step([], LADDER, near=True).barred == frozenset()
    peer = next_step([0], LADDER, near=True)
    assert Mode.IN_PLACE in peer.barred and Mode.HOT_SWAP not in peer.barred
    assert peer.skip == (Tier.MEMORY,) and "skips memory" in peer.why
    durable = next_step([0, 1], LADDER, near=True)
    assert durable.barred == {Mode.IN_PLACE, Mode.SCALE_DOWN, Mode.HOT_SWAP}
    assert durable.skip == (Tier.MEMORY, Tier.PEER)


def test_a_spent_ladder_fails_only_a_job_with_near_tiers() -> None:
    spent = [0, 1, 2, 2]
    assert next_step(spent, LADDER, near=True).rung is None
    assert next_step(spent, LADDER, near=False).rung == 2  # durable only: the backoff rules


def test_a_rung_with_no_room_is_skipped() -> None:
    assert rung_of([], LadderConfig(in_place=0)) == 1
    with pytest.raises(ValidationError):
        LadderConfig(requeue=-1)
