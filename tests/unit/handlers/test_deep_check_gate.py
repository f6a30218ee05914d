"""The deep-check gate through the real handlers: a node enters service only once its deep
checks passed (or, by policy, could not run: recorded as unknown); a failure keeps it out and
is repaired like any fault, after which the node is checked again."""

from __future__ import annotations

from dataclasses import replace

from services.job_submission import commands as job_commands
from shared.config import ControlPlaneConfig
from shared.domain.events import NodeHealthReported, NodeProvisioned, NodeRepairCompleted
from shared.domain.health import Condition, ConditionStatus, RepairAction
from shared.domain.model import NodeState
from shared.policies.repair import DEEP_CHECK
from tests.harness import CLUSTER, Plane, deep_check_results, healthy, xid

NODE = "c1-gpu-000"
ON = frozenset({"first_join", "reimage", "replace"})


def plane_with(**repair: object) -> Plane:
    """The cluster up but for NODE (its peers passed their checks: the blast-radius guard
    lets one node of the partition out), NODE still provisioning."""
    config = ControlPlaneConfig()
    plane = Plane(replace(config, repair=replace(config.repair, **repair)))
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()
    others = [n for n in plane.compute.provisioned if n != NODE]
    for node_id in others:
        plane.inject(NodeProvisioned(node_id=node_id))
    plane.deliver()
    for node_id, attempt in list(plane.compute.deep_checks):
        plane.report(node_id, deep_check_results(plane.clock.now(), attempt),
                     source="deep-check")
    for _ in range(plane.deps.config.repair.return_after_passes):
        plane.clock.advance(1)
        for node_id in others:
            plane.report(node_id, healthy(plane.clock.now()))
        plane.deliver()
    assert all(plane.node(n).state is NodeState.IDLE for n in others if "gpu" in n)
    plane.compute.deep_checks.clear()
    return plane


def verifying(plane: Plane) -> None:
    """The node is up and has passed enough agent checks: only the gate keeps it out."""
    plane.inject(NodeProvisioned(node_id=NODE))
    plane.deliver()
    for _ in range(plane.deps.config.repair.return_after_passes + 1):
        plane.clock.advance(1)
        plane.report(NODE, healthy(plane.clock.now()))
        plane.deliver()


def deep_result(plane: Plane, attempt: int, **statuses: str) -> None:
    plane.clock.advance(60)
    plane.report(NODE, deep_check_results(plane.clock.now(), attempt, **statuses),
                 source="deep-check")
    plane.deliver()


def gate(plane: Plane) -> tuple[str, str]:
    cond = plane.node(NODE).conditions[DEEP_CHECK]
    return cond.status, cond.reason


def test_a_new_node_waits_for_its_deep_checks_and_enters_when_they_pass() -> None:
    plane = plane_with(deep_checks_on=ON)
    verifying(plane)
    assert (NODE, 1) in plane.compute.deep_checks
    assert plane.node(NODE).state is NodeState.VERIFYING  # passes counted, gate pending
    assert gate(plane)[0] == "unknown" and gate(plane)[1].startswith("pending")

    deep_result(plane, 1)
    assert plane.node(NODE).state is NodeState.IDLE
    assert gate(plane) == ("false", "deep checks (dcgm level 3) passed")


def test_without_deep_checks_configured_nothing_is_asked_or_gated() -> None:
    plane = plane_with()
    verifying(plane)
    assert plane.compute.deep_checks == []
    assert plane.node(NODE).state is NodeState.IDLE
    assert DEEP_CHECK not in plane.node(NODE).conditions


def test_tools_absent_is_unknown_recorded_and_passes_by_default() -> None:
    plane = plane_with(deep_checks_on=ON)
    verifying(plane)
    deep_result(plane, 1, dcgm="unknown", bandwidth="unknown")
    assert plane.node(NODE).state is NodeState.VERIFYING  # an all-unknown report: not a pass
    plane.clock.advance(1)
    plane.report(NODE, healthy(plane.clock.now()))
    plane.deliver()
    assert plane.node(NODE).state is NodeState.IDLE
    status, reason = gate(plane)
    assert status == "unknown" and "could not tell" in reason  # never recorded as ok


def test_unknown_under_a_hold_policy_keeps_the_node_out() -> None:
    plane = plane_with(deep_checks_on=ON, deep_check_on_unknown="hold")
    verifying(plane)
    deep_result(plane, 1, bandwidth="unknown")
    for _ in range(3):
        plane.clock.advance(1)
        plane.report(NODE, healthy(plane.clock.now()))
        plane.deliver()
    assert plane.node(NODE).state is NodeState.VERIFYING
    assert gate(plane)[0] == "unknown"


def test_a_new_node_that_fails_its_deep_checks_stays_out_with_an_alert() -> None:
    plane = plane_with(deep_checks_on=ON)
    verifying(plane)
    deep_result(plane, 1, dcgm="true")  # DCGM level 3 failed
    assert gate(plane)[0] == "true" and "failed" in gate(plane)[1]
    held = [e.event for e in plane.delivered if e.type == "mtc.node.repair_held.v1"]
    assert held and held[-1].node_id == NODE  # (the guard counts the new node as settling)
    verifying_reports(plane)  # healthy agent reports do not let it in
    assert plane.node(NODE).state is NodeState.VERIFYING


def test_a_repaired_node_that_fails_is_repaired_again_and_rechecked() -> None:
    # (no lemon, and a short escalation window: the bandwidth rule's own action, a reboot)
    plane = plane_with(deep_checks_on=frozenset({"reimage"}), lemon_failure_count=10,
                       escalation_window_s=60.0)
    verifying(plane)
    assert plane.node(NODE).state is NodeState.IDLE  # first join not configured
    attempt = reimaged(plane)
    deep_result(plane, attempt + 1, bandwidth="true")  # the collective test: too slow
    assert gate(plane)[0] == "true" and plane.node(NODE).state is not NodeState.IDLE
    [(_, action, again)] = plane.compute.repairs  # diagnosed and repaired like any fault
    assert (action, again) == (RepairAction.REBOOT, attempt + 1)
    assert plane.node(NODE).state is NodeState.REPAIRING
    plane.clock.advance(120)
    plane.finish_repairs()  # not a configured trigger, but it failed: it is checked again
    assert (NODE, again + 1) in plane.compute.deep_checks
    deep_result(plane, attempt + 1)  # a late result of the failed attempt: ignored
    assert gate(plane)[1].startswith("pending")
    verifying_reports(plane)
    assert plane.node(NODE).state is NodeState.VERIFYING
    deep_result(plane, again + 1)
    assert plane.node(NODE).state is NodeState.IDLE and gate(plane)[0] == "false"


def reimaged(plane: Plane) -> int:
    """XID 79 (a reboot: no deep checks), then past the blast window a DCGM level 2 failure
    (a reimage), which completes. Returns the reimage's attempt."""
    plane.clock.advance(10)
    plane.report(NODE, xid(79, plane.clock.now()))  # -> reboot
    plane.deliver()
    plane.clock.advance(120)
    plane.finish_repairs()
    verifying_reports(plane)
    assert plane.node(NODE).state is NodeState.IDLE and plane.compute.deep_checks == []
    plane.clock.advance(plane.deps.config.repair.blast_window_s + 10)
    plane.report(NODE, (Condition("DcgmDiagFailed", ConditionStatus.TRUE, "level 2 failed",
                                  plane.clock.now(), {"level": 2}).to_dict(),))
    plane.deliver()
    [(_, action, attempt)] = plane.compute.repairs
    assert action is RepairAction.REIMAGE
    plane.clock.advance(120)
    plane.inject(NodeRepairCompleted(node_id=NODE, action="reimage", attempt=attempt, ok=True))
    plane.compute.repairs.clear()
    plane.deliver()
    assert plane.compute.deep_checks == [(NODE, attempt + 1)]
    return attempt


def verifying_reports(plane: Plane) -> None:
    for _ in range(plane.deps.config.repair.return_after_passes + 1):
        plane.clock.advance(1)
        plane.report(NODE, healthy(plane.clock.now()))
        plane.deliver()


def test_a_reimage_opens_the_gate_and_a_reboot_does_not() -> None:
    plane = plane_with(deep_checks_on=frozenset({"reimage"}))
    verifying(plane)
    attempt = reimaged(plane)
    verifying_reports(plane)
    assert plane.node(NODE).state is NodeState.VERIFYING
    deep_result(plane, attempt + 1)
    assert plane.node(NODE).state is NodeState.IDLE


def test_a_backend_without_deep_checks_records_unknown_at_once() -> None:
    plane = plane_with(deep_checks_on=ON)

    class NoDeep:  # the fake without start_deep_check
        def __getattr__(self, name: str) -> object:
            if name == "start_deep_check":
                raise AttributeError(name)
            return getattr(fake, name)

    fake = plane.compute
    plane.deps = replace(plane.deps, compute=NoDeep())  # type: ignore[arg-type]
    verifying(plane)
    status, reason = gate(plane)
    assert status == "unknown" and "runs none" in reason
    assert plane.node(NODE).state is NodeState.IDLE  # default policy: pass, recorded


def test_deep_check_results_outside_the_agents_report_order_still_count() -> None:
    """A deep check's report may be observed before the agent's latest one arrived."""
    plane = plane_with(deep_checks_on=ON)
    verifying(plane)
    observed = plane.clock.now() - 1.5  # before the last agent report, after provisioning
    plane.inject(NodeHealthReported(node_id=NODE, observed_at=observed,
                                    conditions=deep_check_results(observed, 1),
                                    source="deep-check"))
    plane.deliver()
    assert gate(plane)[0] == "false" and plane.node(NODE).state is NodeState.IDLE
