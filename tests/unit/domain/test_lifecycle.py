"""The node lifecycle rules (shared/domain/lifecycle.py) and exit-code meaning (exits.py)."""

from __future__ import annotations

import pytest

from shared.domain import exits, lifecycle
from shared.domain.health import (
    Condition,
    ConditionStatus,
    ConditionType,
    FailureRecord,
    HealthReport,
    RepairAction,
)
from shared.domain.model import Node, NodeRole, NodeState, Partition

T = 1_800_000_000.0


def node(state: NodeState = NodeState.IDLE, job_id: str | None = None) -> Node:
    return Node("n1", "c1", "gpu", "train", NodeRole.WORKER, "a3", "H100", 8, state, T,
                job_id=job_id)


def report(*conds: Condition, at: float = T, source: str = "agent") -> HealthReport:
    return HealthReport("n1", at, conds, source)


def cond(ctype: ConditionType, status: ConditionStatus, reason: str = "r",
         since: float = T) -> Condition:
    return Condition(ctype.value, status, reason, since)


XID = ConditionType.XID_ERROR
OK, BAD = ConditionStatus.FALSE, ConditionStatus.TRUE


def test_history_is_trimmed_to_the_newest() -> None:
    n = node()
    for i in range(lifecycle.MAX_HISTORY + 5):
        lifecycle.record_failure(n, FailureRecord(float(i), "m", RepairAction.REBOOT))
    assert len(n.history) == lifecycle.MAX_HISTORY
    assert n.history[0].at == 5.0 and n.history[-1].at == lifecycle.MAX_HISTORY + 4


def test_a_report_that_repeats_the_conditions_changes_nothing_but_last_seen() -> None:
    n = node()
    assert lifecycle.observe(n, report(cond(XID, OK)))
    assert not lifecycle.observe(n, report(cond(XID, OK), at=T + 5))
    assert n.conditions[XID.value].last_seen == T + 5
    assert n.conditions[XID.value].since == T
    assert lifecycle.observe(n, report(cond(XID, BAD, since=T + 6), at=T + 6))
    assert n.conditions[XID.value].status == "true"


def test_an_agent_report_clears_a_heartbeat_loss_it_does_not_mention() -> None:
    n = node()
    lost = lifecycle.heartbeat_lost(n, T + 100, 30.0)
    assert lost is not None and lost.since == T + 30.0
    assert lifecycle.observe(n, report(lost, at=T + 100, source="heartbeat-monitor"))
    assert lifecycle.heartbeat_lost(n, T + 200, 30.0) is None  # raised once, not per tick
    assert lifecycle.observe(n, report(cond(XID, OK), at=T + 201))
    assert n.conditions[ConditionType.HEARTBEAT_LOST.value].status == "false"


def test_heartbeat_is_watched_only_in_service() -> None:
    assert lifecycle.heartbeat_lost(node(NodeState.REPAIRING), T + 100, 30.0) is None
    n = node()
    n.last_report_at = T + 90
    assert lifecycle.heartbeat_lost(n, T + 100, 30.0) is None


def test_alert_once_then_on_change_or_after_the_reminder() -> None:
    n = node()
    assert lifecycle.alert_due(n, "held:reboot", T, 600)
    assert not lifecycle.alert_due(n, "held:reboot", T + 599, 600)
    assert lifecycle.alert_due(n, "held:reimage", T + 1, 600)  # changed
    assert not lifecycle.alert_due(n, "held:reimage", T + 2, 600)
    assert lifecycle.alert_due(n, "held:reimage", T + 601, 600)  # reminder


def test_diagnosis_is_due_on_change_while_verifying_or_per_reminder() -> None:
    n = node(NodeState.SUSPECT)
    assert lifecycle.diagnosis_due(n, "xid", RepairAction.REBOOT, True, T, 600)
    n.last_diagnosis = "xid"
    assert not lifecycle.diagnosis_due(n, "xid", RepairAction.REBOOT, False, T + 1, 600)
    assert lifecycle.diagnosis_due(n, "xid", RepairAction.REIMAGE, False, T + 2, 600)
    assert lifecycle.diagnosis_due(n, "xid", RepairAction.REIMAGE, False, T + 603, 600)
    n.state = NodeState.VERIFYING
    assert lifecycle.diagnosis_due(n, "xid", RepairAction.REIMAGE, False, T + 604, 600)


def test_take_out_drains_a_busy_node_and_drains_an_idle_one_at_once() -> None:
    part = Partition("c1", "train", total_nodes=4)
    busy = node(NodeState.ALLOCATED, job_id="j1")
    assert lifecycle.take_out_of_service(busy, part, RepairAction.REBOOT, T, "xid", 3600)
    assert busy.state is NodeState.DRAINING and busy.repair_action is RepairAction.REBOOT
    idle = node()
    idle.node_id = "n2"
    assert not lifecycle.take_out_of_service(idle, part, RepairAction.REBOOT, T, "xid", 3600)
    assert idle.state is NodeState.DRAINED
    assert part.out_of_service == {"n1", "n2"} and part.removed_at == [T, T]


def test_return_to_service_puts_the_node_back_in_its_partition() -> None:
    part = Partition("c1", "train", total_nodes=4, out_of_service={"n1"})
    n = node(NodeState.VERIFYING)
    lifecycle.count_pass(n, T)
    lifecycle.return_to_service(n, part, T + 1)
    assert n.state is NodeState.IDLE and part.out_of_service == set() and n.passes == 0


def test_hold_and_release() -> None:
    n = node(NodeState.ALLOCATED, job_id="j1")
    lifecycle.hold(n, T, "blast radius")
    assert n.state is NodeState.SUSPECT
    assert lifecycle.release_hold(n, T + 1)
    assert n.state is NodeState.ALLOCATED
    assert not lifecycle.release_hold(n, T + 2)


@pytest.mark.parametrize(("state", "after", "drained"), [
    (NodeState.ALLOCATED, NodeState.IDLE, False),
    (NodeState.SUSPECT, NodeState.SUSPECT, False),
    (NodeState.DRAINING, NodeState.DRAINED, True),
])
def test_release_from_job(state: NodeState, after: NodeState, drained: bool) -> None:
    n = node(state, job_id="j1")
    assert lifecycle.release_from_job(n, "j1", T) is drained
    assert n.state is after and n.job_id is None


def test_release_leaves_another_jobs_node_alone() -> None:
    n = node(NodeState.ALLOCATED, job_id="j2")
    assert not lifecycle.release_from_job(n, "j1", T)
    assert n.state is NodeState.ALLOCATED and n.job_id == "j2"


def test_retire_from_any_live_state_once() -> None:
    n = node(NodeState.ALLOCATED, job_id="j1")
    assert lifecycle.retire(n, T, "deleted")
    assert n.state is NodeState.RETIRED and n.job_id is None
    assert not lifecycle.retire(n, T, "deleted")


def test_partition_round_trips_its_sorted_ids_without_resorting() -> None:
    part = Partition("c1", "train", out_of_service={"b", "a"})
    doc = part.to_dict()
    assert doc["out_of_service"] == ["a", "b"]
    again = Partition.from_dict(doc)
    again.take_out("c", T, 60)
    again.put_back("a")
    assert again.to_dict()["out_of_service"] == ["b", "c"]
    again.set_out_of_service({"z", "y"})
    assert again.to_dict()["out_of_service"] == ["y", "z"]


@pytest.mark.parametrize(("code", "interrupted", "anyway", "verdict"), [
    (0, False, False, exits.Verdict.SUCCEEDED),
    (1, False, False, exits.Verdict.FAILED),
    (1, False, True, exits.Verdict.RESTART),
    (1, True, False, exits.Verdict.RESTART),
    (75, False, False, exits.Verdict.RESTART),
    (137, False, False, exits.Verdict.FAILED),  # a SIGKILL nobody explains: the program's
    (-9, False, False, exits.Verdict.FAILED),
    (139, False, False, exits.Verdict.FAILED),  # SIGSEGV: the program's own
    (139, True, False, exits.Verdict.RESTART),  # ... unless the infrastructure ended it
    (139, False, True, exits.Verdict.RESTART),  # or the spec restarts anyway
    (0, True, False, exits.Verdict.RESTART),
])
def test_exit_verdict(code: int, interrupted: bool, anyway: bool,
                      verdict: exits.Verdict) -> None:
    assert exits.exit_verdict(code, interrupted=interrupted, restart_anyway=anyway,
                              restarts=0, max_restarts=3) is verdict


def test_exit_verdict_gives_up_when_the_budget_is_spent() -> None:
    assert exits.exit_verdict(75, interrupted=False, restart_anyway=False, restarts=3,
                              max_restarts=3) is exits.Verdict.GAVE_UP
    assert exits.infrastructure_ended(75, interrupted=False, node_fault=False)
    assert not exits.infrastructure_ended(143, interrupted=False, node_fault=False)
    assert exits.infrastructure_ended(139, interrupted=False, node_fault=True)
    assert exits.describe(139) == "code 139 (SIGSEGV)" and exits.describe(-9) == "code -9 (SIGKILL)"
    assert exits.describe(1) == "code 1"


def test_a_node_coming_up_is_counted_until_it_enters_service_or_is_taken_out() -> None:
    part = Partition("c1", "train", total_nodes=3, settling=2)
    assert part.down == 2
    first = node(NodeState.VERIFYING)
    lifecycle.return_to_service(first, part, T)
    assert part.settling == 1 and part.out_of_service == set()
    sick = node(NodeState.VERIFYING)
    sick.node_id = "n2"
    lifecycle.take_out_of_service(sick, part, RepairAction.REBOOT, T, "xid", 3600)
    assert part.settling == 0 and part.out_of_service == {"n2"} and part.down == 1
