"""decide(): repair's one decision about a diagnosis, rule by rule (a person's drain, a
person's return, a straggler kept, a rack drained or held, the per-node ladder and guard)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.domain.health import Diagnosis, FailureRecord, RepairAction, Severity
from shared.domain.lifecycle import ACTIONABLE, OPERATOR_DRAIN_MODE
from shared.domain.model import NodeState
from shared.policies.domains import DomainView
from shared.policies.recovery import Mode
from shared.policies.repair import PartitionView, RepairConfig
from shared.policies.repair_decision import (
    FleetFacts,
    NodeFacts,
    RepairFacts,
    StepKind,
    decide,
    decided_by_node,
    owed,
    rack_matters,
)
from shared.policies.stragglers import Verdict
from tests.unit.policies.builders import NOW, seen

A = RepairAction
CONFIG = RepairConfig()
RACKS = RepairConfig(domain_drain_fraction=0.5, max_domains_out=1)
EASY = PartitionView("p", 8, frozenset(), ())  # room under every guard limit
FULL = PartitionView("p", 4, frozenset({"n9"}), ())  # one of four out: the guard is at its limit
RACK = frozenset({"n0", "n1", "n2", "n3"})
ROOMY = FleetFacts(EASY)


def diagnosis(action: RepairAction = A.REBOOT, mode: str = "xid_79") -> Diagnosis:
    return Diagnosis(mode, Severity.CRITICAL, action)


def facts(action: RepairAction = A.REBOOT, *, state: NodeState = NodeState.ALLOCATED,
          repair_action: RepairAction | None = None, drain: str | None = None,
          rack: str = "", history: tuple[FailureRecord, ...] = (), mode: str = "xid_79",
          fleet: FleetFacts | None = ROOMY) -> RepairFacts:
    return RepairFacts(NodeFacts("n0", state, repair_action, drain, rack, history),
                       diagnosis(action, mode), fleet)


def verdict(swap: bool) -> Verdict:
    return Verdict(swap, 100.0, 50.0, Mode.HOT_SWAP, "swap: ..." if swap else "wait: cheaper")


def rack_view(bad: frozenset[str] = frozenset({"n1"}), drained_in_partition: int = 0
              ) -> DomainView:
    return DomainView("r0", RACK, bad, False, drained_in_partition)


# ------------------------------------------------------------- rules 1-3: the node alone


@pytest.mark.parametrize("state", sorted(set(NodeState) - ACTIONABLE))
def test_a_node_out_of_service_already_is_left_alone(state: NodeState) -> None:
    f = facts(state=state, fleet=None)
    assert decided_by_node(f)
    step = decide(f, NOW, CONFIG)
    assert step.kind is StepKind.NONE and step.failure is None


def test_a_standing_operator_drain_drains_without_the_guard() -> None:
    f = facts(A.MANUAL, mode=OPERATOR_DRAIN_MODE, drain="maintenance by ops", fleet=None)
    assert decided_by_node(f)
    step = decide(f, NOW, CONFIG)
    assert (step.kind, step.reason, step.failure) == (StepKind.OPERATOR_DRAIN,
                                                       "maintenance by ops", None)


def test_a_lifted_operator_drain_does_nothing() -> None:
    f = facts(A.MANUAL, mode=OPERATOR_DRAIN_MODE, drain=None, fleet=None)
    assert decide(f, NOW, CONFIG).kind is StepKind.NONE


def test_a_node_a_person_returned_that_fails_again_goes_back_to_them() -> None:
    f = facts(state=NodeState.VERIFYING, repair_action=A.MANUAL, fleet=None)
    step = decide(f, NOW, CONFIG)
    assert step.kind is StepKind.FAIL
    assert step.reason == "failed its checks after an operator returned it: xid_79"


def test_a_verifying_node_after_a_machine_repair_climbs_the_ladder() -> None:
    f = facts(state=NodeState.VERIFYING, repair_action=A.REBOOT)
    assert not decided_by_node(f)
    assert decide(f, NOW, CONFIG).kind is StepKind.REPAIR


def test_an_open_decision_without_fleet_facts_is_refused() -> None:
    f = facts(fleet=None)
    assert not decided_by_node(f)
    with pytest.raises(ValueError, match="fleet facts"):
        decide(f, NOW, CONFIG)


# ------------------------------------------------------------------ the held repair owed


def test_a_held_repair_is_still_owed_on_a_lesser_diagnosis() -> None:
    f = facts(A.RESTART_JOB, state=NodeState.SUSPECT, repair_action=A.REIMAGE)
    assert owed(f).action is A.REIMAGE
    step = decide(f, NOW, CONFIG)
    assert (step.kind, step.action) == (StepKind.REPAIR, A.REIMAGE)


def test_a_greater_diagnosis_wins_over_the_held_repair() -> None:
    f = facts(A.REPLACE, state=NodeState.SUSPECT, repair_action=A.REBOOT)
    assert owed(f).action is A.REPLACE


def test_only_a_suspect_carries_a_held_repair() -> None:
    f = facts(A.RESTART_JOB, state=NodeState.ALLOCATED, repair_action=A.REIMAGE)
    assert owed(f).action is A.RESTART_JOB
    assert decide(f, NOW, CONFIG).kind is StepKind.RESTART_JOB


# ---------------------------------------------------------------------- rule 4: stragglers


def test_a_straggler_cheaper_to_keep_stays_with_the_weighing_on_it() -> None:
    step = decide(facts(fleet=FleetFacts(EASY, verdict(swap=False))), NOW, CONFIG)
    assert (step.kind, step.reason, step.failure) == (StepKind.KEEP, "wait: cheaper", None)


def test_a_straggler_worth_moving_goes_through_the_ladder() -> None:
    step = decide(facts(fleet=FleetFacts(EASY, verdict(swap=True))), NOW, CONFIG)
    assert step.kind is StepKind.REPAIR


def test_a_kept_straggler_is_not_drained_with_its_rack() -> None:
    f = facts(rack="r0", fleet=FleetFacts(EASY, verdict(swap=False), rack_view()))
    assert decide(f, NOW, RACKS).kind is StepKind.KEEP


# --------------------------------------------------------------------------- rule 5: racks


@pytest.mark.parametrize(("action", "own"), [(A.RESET_GPU, A.REBOOT), (A.REBOOT, A.REBOOT),
                                             (A.REIMAGE, A.REIMAGE), (A.REPLACE, A.REPLACE)])
def test_a_bad_rack_drains_as_one_the_node_taking_at_least_a_reboot(
        action: RepairAction, own: RepairAction) -> None:
    f = facts(action, rack="r0", fleet=FleetFacts(EASY, rack=rack_view()))
    assert rack_matters(f, RACKS)
    step = decide(f, NOW, RACKS)
    assert (step.kind, step.action) == (StepKind.DRAIN_RACK, own)
    assert step.failure == FailureRecord(NOW, "xid_79", own)
    assert "r0" in step.reason


def test_a_held_rack_raises_its_alert_and_the_node_goes_per_node() -> None:
    f = facts(rack="r0", fleet=FleetFacts(EASY, rack=rack_view(drained_in_partition=1)))
    step = decide(f, NOW, RACKS)
    assert step.kind is StepKind.REPAIR and step.action is A.REBOOT
    assert step.rack_held is not None and "r0" in step.rack_held


def test_a_rack_not_bad_enough_leaves_it_to_the_node() -> None:
    f = facts(rack="r0", fleet=FleetFacts(EASY, rack=rack_view(bad=frozenset())))
    step = decide(f, NOW, RACKS)
    assert step.kind is StepKind.REPAIR and step.rack_held is None


@pytest.mark.parametrize(("action", "rack", "config"), [
    (A.REBOOT, "r0", CONFIG),  # racks as a unit off (the default)
    (A.REBOOT, "", RACKS),  # a node without a rack
    (A.RESTART_JOB, "r0", RACKS),  # nothing takes the node out
    (A.NONE, "r0", RACKS),
])
def test_a_rack_is_weighed_only_when_the_node_would_leave_a_rack(
        action: RepairAction, rack: str, config: RepairConfig) -> None:
    f = facts(action, rack=rack, fleet=FleetFacts(EASY, rack=rack_view()))
    assert not rack_matters(f, config)
    step = decide(f, NOW, config)
    assert step.kind is not StepKind.DRAIN_RACK and step.rack_held is None


def test_the_held_repair_owed_makes_the_rack_matter() -> None:
    f = facts(A.RESTART_JOB, state=NodeState.SUSPECT, repair_action=A.REBOOT, rack="r0",
              fleet=FleetFacts(EASY, rack=rack_view()))
    assert rack_matters(f, RACKS)
    assert decide(f, NOW, RACKS).kind is StepKind.DRAIN_RACK


# ------------------------------------------------------------------ rule 6: the per node


@pytest.mark.parametrize(("action", "partition", "kind", "recorded"), [
    (A.NONE, EASY, StepKind.NONE, False),
    (A.RESTART_JOB, EASY, StepKind.RESTART_JOB, True),
    (A.REBOOT, EASY, StepKind.REPAIR, True),
    (A.REBOOT, FULL, StepKind.HOLD, False),  # the blast-radius guard
    (A.MANUAL, EASY, StepKind.REPAIR, True),  # drained for a person, through the guard
])
def test_the_per_node_policy_decides_the_rest(action: RepairAction, partition: PartitionView,
                                              kind: StepKind, recorded: bool) -> None:
    step = decide(facts(action, fleet=FleetFacts(partition)), NOW, CONFIG)
    assert step.kind is kind
    if kind is not StepKind.NONE:
        assert step.action is action
    assert (step.failure is not None) is recorded
    if step.failure is not None:
        assert step.failure == FailureRecord(NOW, "xid_79", action)


def test_the_ladder_reads_the_history_at_the_time_passed_in() -> None:
    history = (seen("xid_79", 600, A.REBOOT),)
    f = facts(history=history)
    assert decide(f, NOW, CONFIG).action is A.REIMAGE  # failed again soon after a reboot
    later = NOW + CONFIG.escalation_window_s + 1
    step = decide(f, later, CONFIG)
    assert step.action is A.REBOOT and step.failure is not None and step.failure.at == later


def test_a_lemon_is_replaced() -> None:
    history = tuple(seen("xid_79", 3600 * (i + 1), A.REBOOT) for i in range(2))
    step = decide(facts(history=history), NOW, replace(CONFIG, escalation_window_s=60.0))
    assert (step.kind, step.action) == (StepKind.REPAIR, A.REPLACE)
