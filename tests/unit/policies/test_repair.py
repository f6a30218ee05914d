"""plan_repair(): ladder, lemon, blast-radius guard, MANUAL; escalation and hysteresis."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.errors import ValidationError
from shared.domain.health import Diagnosis, FailureRecord, RepairAction, Severity
from shared.policies.ranking import action_rank
from shared.policies.repair import (
    DecisionKind,
    PartitionView,
    RepairConfig,
    RepairDecision,
    allowed_out_of_service,
    allowed_removals_in_window,
    load_repair_config,
    next_rung_after_failure,
    plan_repair,
    ready_to_return,
)
from tests.unit.policies.builders import NOW, seen

A = RepairAction
CONFIG = RepairConfig()
HOUR = 3600.0
DAY = 24 * HOUR


def diag(action: RepairAction, mode: str = "fault") -> Diagnosis:
    return Diagnosis(mode, Severity.CRITICAL, action)


def view(
    total: int = 8, out: tuple[str, ...] = (), removed_ago: tuple[float, ...] = ()
) -> PartitionView:
    return PartitionView("p", total, frozenset(out), tuple(NOW - ago for ago in removed_ago))


def plan(
    action: RepairAction,
    history: tuple[FailureRecord, ...] = (),
    partition: PartitionView | None = None,
    node_id: str = "n1",
    config: RepairConfig = CONFIG,
) -> RepairDecision:
    return plan_repair(diag(action), list(history), partition or view(), node_id, NOW, config)


# --- no node action -----------------------------------------------------------------------------


def test_none_is_no_action() -> None:
    d = plan(A.NONE)
    assert (d.kind, d.action, d.rung, d.is_lemon) == (DecisionKind.NO_ACTION, A.NONE, -1, False)


def test_restart_job_is_not_a_node_action_and_ignores_the_guard() -> None:
    full = view(total=4, out=("a", "b", "c"))
    d = plan(A.RESTART_JOB, partition=full)
    assert (d.kind, d.action, d.rung) == (DecisionKind.RESTART_JOB, A.RESTART_JOB, -1)


# --- ladder -------------------------------------------------------------------------------------


def test_first_failure_takes_the_action_triage_asked_for() -> None:
    d = plan(A.RESET_GPU)
    assert (d.kind, d.action, d.rung, d.is_lemon) == (DecisionKind.REPAIR, A.RESET_GPU, 0, False)
    assert plan(A.REIMAGE).rung == 2


def test_failing_again_within_the_window_climbs_one_rung() -> None:
    d = plan(A.RESET_GPU, history=(seen("x", HOUR, A.RESET_GPU),))
    assert (d.action, d.rung) == (A.REBOOT, 1)
    d = plan(A.RESET_GPU, history=(seen("x", HOUR, A.REBOOT),))
    assert (d.action, d.rung) == (A.REIMAGE, 2)
    d = plan(A.RESET_GPU, history=(seen("x", HOUR, A.REIMAGE),))
    assert (d.action, d.rung) == (A.REPLACE, 3)


def test_the_latest_failure_in_the_window_sets_the_rung() -> None:
    history = (seen("x", 2 * HOUR, A.REIMAGE), seen("x", HOUR, A.RESET_GPU))
    config = RepairConfig(lemon_failure_count=10)
    assert plan(A.RESET_GPU, history=history, config=config).action is A.REBOOT


def test_failing_again_outside_the_window_starts_over() -> None:
    d = plan(A.RESET_GPU, history=(seen("x", DAY + 1, A.REBOOT),))
    assert (d.action, d.rung) == (A.RESET_GPU, 0)


def test_never_below_what_triage_asked_for() -> None:
    d = plan(A.REIMAGE, history=(seen("x", HOUR, A.RESET_GPU),))
    assert d.action is A.REIMAGE


def test_the_top_rung_stays_at_the_top() -> None:
    assert plan(A.REBOOT, history=(seen("x", HOUR, A.REPLACE),)).action is A.REPLACE


def test_after_manual_a_repeat_goes_to_the_top() -> None:
    assert plan(A.RESET_GPU, history=(seen("x", HOUR, A.MANUAL),)).action is A.REPLACE


def test_sightings_and_job_restarts_do_not_climb() -> None:
    history = (seen("slow_node", HOUR), seen("x", 2 * HOUR, A.RESTART_JOB))
    assert plan(A.RESET_GPU, history=history).action is A.RESET_GPU


def test_future_records_are_ignored() -> None:
    assert plan(A.RESET_GPU, history=(seen("x", -60, A.REBOOT),)).action is A.RESET_GPU


def test_custom_ladder_maps_up_to_the_next_rung() -> None:
    config = RepairConfig(ladder=(A.REBOOT, A.REPLACE))
    d = plan(A.RESET_GPU, config=config)
    assert (d.action, d.rung) == (A.REBOOT, 0)
    d = plan(A.REIMAGE, config=config)
    assert (d.action, d.rung) == (A.REPLACE, 1)


def test_action_above_a_short_ladder_is_kept() -> None:
    config = RepairConfig(ladder=(A.RESET_GPU, A.REBOOT))
    d = plan(A.REPLACE, config=config)
    assert (d.kind, d.action, d.rung) == (DecisionKind.REPAIR, A.REPLACE, -1)


# --- lemon --------------------------------------------------------------------------------------


def test_third_failure_in_a_week_is_a_lemon() -> None:
    history = (seen("x", 3 * DAY, A.RESET_GPU), seen("y", 6 * DAY, A.REBOOT))
    d = plan(A.RESET_GPU, history=history)
    assert (d.kind, d.action, d.is_lemon, d.rung) == (DecisionKind.REPAIR, A.REPLACE, True, 3)
    assert "lemon" in d.reason


def test_failures_older_than_the_lemon_window_do_not_count() -> None:
    history = (seen("x", 3 * DAY, A.RESET_GPU), seen("y", 8 * DAY, A.REBOOT))
    d = plan(A.RESET_GPU, history=history)
    assert (d.action, d.is_lemon) == (A.RESET_GPU, False)


def test_sightings_do_not_make_a_lemon() -> None:
    history = (
        *(seen("slow_node", HOUR * i) for i in range(1, 10)),
        seen("x", 2 * DAY, A.RESTART_JOB),
        seen("x", 3 * DAY, A.RESTART_JOB),
    )
    assert not plan(A.RESET_GPU, history=history).is_lemon


def test_lemon_beats_manual() -> None:
    history = (seen("x", DAY, A.REBOOT), seen("y", 2 * DAY, A.REBOOT))
    d = plan(A.MANUAL, history=history)
    assert (d.action, d.is_lemon) == (A.REPLACE, True)


# --- MANUAL -------------------------------------------------------------------------------------


def test_manual_drains_and_holds_for_a_person() -> None:
    d = plan(A.MANUAL, history=(seen("x", HOUR, A.REBOOT),))
    assert (d.kind, d.action, d.rung, d.is_lemon) == (DecisionKind.REPAIR, A.MANUAL, -1, False)


def test_manual_is_subject_to_the_guard() -> None:
    d = plan(A.MANUAL, partition=view(total=4, out=("a",)))
    assert (d.kind, d.action) == (DecisionKind.HOLD, A.MANUAL)


# --- blast-radius guard -------------------------------------------------------------------------


def test_allowed_is_the_larger_of_the_minimum_and_the_share() -> None:
    assert allowed_out_of_service(8, CONFIG) == 2
    assert allowed_out_of_service(2, CONFIG) == 1  # floor(0.5) = 0, minimum 1
    assert allowed_out_of_service(0, CONFIG) == 1
    assert allowed_out_of_service(100, RepairConfig(max_out_of_service_fraction=0.29)) == 29


def test_guard_allows_up_to_the_limit() -> None:
    d = plan(A.REBOOT, partition=view(total=8, out=("a",)))
    assert d.kind is DecisionKind.REPAIR


def test_guard_holds_past_the_limit_and_keeps_the_wanted_action() -> None:
    history = (seen("x", DAY, A.REBOOT), seen("y", 2 * DAY, A.REBOOT))
    d = plan(A.REBOOT, history=history, partition=view(total=8, out=("a", "b")))
    assert (d.kind, d.action, d.is_lemon) == (DecisionKind.HOLD, A.REPLACE, True)
    assert "2 of 8" in d.reason


def test_nodes_still_coming_up_count_against_the_guard() -> None:
    # limit 2 of 8: one node out and one still coming up leave no room for a third
    settling = PartitionView("p", 8, frozenset({"a"}), (), settling=1)
    d = plan(A.REBOOT, partition=settling)
    assert d.kind is DecisionKind.HOLD
    assert "2 of 8" in d.reason
    assert plan(A.REBOOT, partition=view(total=8, out=("a",))).kind is DecisionKind.REPAIR
    with pytest.raises(ValidationError, match="settling"):
        PartitionView("p", 8, frozenset(), (), settling=-1)


def test_node_already_out_is_not_counted_twice() -> None:
    d = plan(A.REIMAGE, partition=view(total=8, out=("n1", "a")), node_id="n1")
    assert d.kind is DecisionKind.REPAIR
    # Even past the limit: it is out already, the decision adds nothing.
    d = plan(A.REIMAGE, partition=view(total=8, out=("n1", "a", "b", "c")), node_id="n1")
    assert d.kind is DecisionKind.REPAIR


def test_many_recent_removals_hold_even_if_nodes_came_back() -> None:
    # 75% of 8 per hour: the 7th removal within the hour is held, the 6th is not
    six = view(total=8, removed_ago=(60, 120, 180, 240, 300, 360))
    d = plan(A.REBOOT, partition=six)
    assert d.kind is DecisionKind.HOLD
    assert "removed" in d.reason and "limit 6" in d.reason
    assert plan(A.REBOOT, partition=view(total=8, removed_ago=(60,) * 5)).kind is \
        DecisionKind.REPAIR


def test_default_guard_allowed_one_removal_per_hour_on_a_small_partition() -> None:
    # On a 4-node partition the removal limit equalled the out-of-service
    # one (1), so a 2nd and 3rd fault within the hour, each after the last node came back,
    # were held. The removal limit is now its own fraction (75%) with a floor of one node.
    assert allowed_removals_in_window(4, CONFIG) == 3
    assert allowed_removals_in_window(1, CONFIG) == 1
    assert allowed_removals_in_window(100, RepairConfig(max_removals_in_window=7)) == 7
    for earlier in ((60,), (60, 120)):
        assert plan(A.REBOOT, partition=view(total=4, removed_ago=earlier)).kind is \
            DecisionKind.REPAIR
    d = plan(A.REBOOT, partition=view(total=4, removed_ago=(60, 120, 180)))
    assert d.kind is DecisionKind.HOLD and "limit 3" in d.reason


def test_old_removals_do_not_hold() -> None:
    d = plan(A.REBOOT, partition=view(total=8, removed_ago=(HOUR + 1, 2 * HOUR, 60)))
    assert d.kind is DecisionKind.REPAIR


def test_removal_limit_can_be_set_apart() -> None:
    config = RepairConfig(max_removals_in_window=5)
    d = plan(A.REBOOT, partition=view(total=8, removed_ago=(60, 120, 180)), config=config)
    assert d.kind is DecisionKind.REPAIR
    config = RepairConfig(max_removals_in_window=0)
    assert plan(A.REBOOT, config=config).kind is DecisionKind.HOLD


def test_small_partition_allows_one() -> None:
    assert plan(A.REBOOT, partition=view(total=2)).kind is DecisionKind.REPAIR
    assert plan(A.REBOOT, partition=view(total=2, out=("a",))).kind is DecisionKind.HOLD


# --- next rung after a failed repair --------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (A.NONE, A.RESET_GPU),
        (A.RESTART_JOB, A.RESET_GPU),
        (A.RESET_GPU, A.REBOOT),
        (A.REBOOT, A.REIMAGE),
        (A.REIMAGE, A.REPLACE),
        (A.REPLACE, A.MANUAL),
        (A.MANUAL, A.MANUAL),
    ],
)
def test_next_rung_after_failure(current: RepairAction, expected: RepairAction) -> None:
    assert next_rung_after_failure(current, CONFIG) is expected


def test_next_rung_with_a_short_ladder() -> None:
    config = RepairConfig(ladder=(A.REBOOT, A.REIMAGE))
    assert next_rung_after_failure(A.RESET_GPU, config) is A.REBOOT
    assert next_rung_after_failure(A.REIMAGE, config) is A.MANUAL
    assert next_rung_after_failure(A.REPLACE, config) is A.MANUAL


# --- hysteresis ---------------------------------------------------------------------------------


def test_return_needs_enough_passes() -> None:
    assert not ready_to_return(0, None, NOW, CONFIG)
    assert not ready_to_return(1, NOW - 10, NOW, CONFIG)
    assert ready_to_return(2, NOW - 10, NOW, CONFIG)
    assert ready_to_return(5, None, NOW, CONFIG)


def test_return_needs_the_passes_to_span_the_interval() -> None:
    config = RepairConfig(return_after_passes=2, return_min_interval_s=600)
    assert not ready_to_return(3, None, NOW, config)
    assert not ready_to_return(3, NOW - 599, NOW, config)
    assert ready_to_return(3, NOW - 600, NOW, config)
    assert not ready_to_return(1, NOW - 6000, NOW, config)


def test_negative_passes_are_an_error() -> None:
    with pytest.raises(ValueError, match="passes"):
        ready_to_return(-1, None, NOW, CONFIG)


# --- configuration ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"ladder": ()}, "ladder"),
        ({"ladder": (A.RESET_GPU, A.MANUAL)}, "ladder[1]"),
        ({"ladder": (A.RESTART_JOB,)}, "ladder[0]"),
        ({"ladder": (A.REBOOT, A.RESET_GPU)}, "ladder[1]"),
        ({"ladder": (A.REBOOT, A.REBOOT)}, "ladder[1]"),
        ({"escalation_window_s": -1}, "escalation_window_s"),
        ({"blast_window_s": -1}, "blast_window_s"),
        ({"lemon_failure_count": 0}, "lemon_failure_count"),
        ({"max_out_of_service_fraction": 1.5}, "max_out_of_service_fraction"),
        ({"min_out_of_service_allowed": -1}, "min_out_of_service_allowed"),
        ({"max_removals_in_window": -1}, "max_removals_in_window"),
        ({"max_removals_fraction_in_window": 1.5}, "max_removals_fraction_in_window"),
        ({"return_after_passes": 0}, "return_after_passes"),
        ({"return_min_interval_s": -5}, "return_min_interval_s"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, Any], path: str) -> None:
    with pytest.raises(ValidationError) as err:
        RepairConfig(**kwargs)
    assert err.value.path == path


def test_load_repair_config() -> None:
    config = load_repair_config(
        {"ladder": ["reboot", "REPLACE"], "lemon_failure_count": 4, "blast_window_s": 600}
    )
    assert config.ladder == (A.REBOOT, A.REPLACE)
    assert config.lemon_failure_count == 4
    assert config.blast_window_s == 600.0
    assert config.escalation_window_s == CONFIG.escalation_window_s
    assert load_repair_config({}) == CONFIG


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"ladder": ["reboot", "explode"]}, "ladder[1]"),
        ({"ladder": "reboot"}, "ladder"),
        ({"lemon_failure_count": True}, "lemon_failure_count"),
        ({"lemon_failure_count": 2.5}, "lemon_failure_count"),
        ({"blast_window_s": "1h"}, "blast_window_s"),
        ({"blast_radius": 3}, "blast_radius"),
    ],
)
def test_load_repair_config_names_the_bad_key(data: dict[str, Any], path: str) -> None:
    with pytest.raises(ValidationError) as err:
        load_repair_config(data)
    assert err.value.path == path


def test_partition_view_rejects_negative_total() -> None:
    with pytest.raises(ValidationError):
        PartitionView("p", -1, frozenset(), ())


# --- properties ---------------------------------------------------------------------------------

_NODE_ACTIONS = [A.RESET_GPU, A.REBOOT, A.REIMAGE, A.REPLACE, A.MANUAL]
_records = st.builds(
    lambda ago, action: seen("x", ago, action),
    st.floats(min_value=-DAY, max_value=30 * DAY),
    st.sampled_from(list(A)),
)


@given(
    st.sampled_from(_NODE_ACTIONS),
    st.lists(_records, max_size=6),
    st.integers(min_value=0, max_value=40),
    st.lists(st.sampled_from(["a", "b", "c", "d", "n1"]), unique=True),
    st.lists(st.floats(min_value=0, max_value=3 * HOUR), max_size=6),
)
def test_a_node_action_is_never_softened(
    wanted: RepairAction,
    history: list[FailureRecord],
    total: int,
    out: list[str],
    removed_ago: list[float],
) -> None:
    partition = view(total=total, out=tuple(out), removed_ago=tuple(removed_ago))
    d = plan_repair(diag(wanted), history, partition, "n1", NOW, CONFIG)
    assert d.kind in (DecisionKind.REPAIR, DecisionKind.HOLD)
    assert d.action.takes_node_out
    assert action_rank(d.action) >= action_rank(wanted)
    assert d.rung == (CONFIG.ladder.index(d.action) if d.action in CONFIG.ladder else -1)
    if "n1" in out:
        assert d.kind is DecisionKind.REPAIR
