"""A candidate triage table on live traffic through the real handlers: in shadow it is
recorded and never applied, recommend-only waits for an operator (or the deadline), active
decides, staged by partition."""

from __future__ import annotations

from typing import Any

from services.job_submission import commands as job_commands
from services.observability import metrics
from shared.domain.errors import Conflict
from shared.domain.events import FleetTicked, NodeOperatorActed
from shared.domain.health import RepairAction
from shared.service_layer import triage_policy
from tests.candidates import CAUSE, rollout
from tests.harness import Plane, xid


def _plane(policy: dict[str, Any]) -> Plane:
    plane = Plane().up()
    plane.api(lambda u, d: triage_policy.configure(u, "c1", policy, "token:ops",
                                                   plane.clock.now()))
    return plane


def _view(plane: Plane) -> dict[str, Any]:
    with plane.uow() as uow:
        return triage_policy.view(uow, "c1")


def _xid(plane: Plane, node: str, code: int) -> None:
    plane.clock.advance(5)
    plane.report(node, xid(code, plane.clock.now()))
    plane.deliver()


def test_shadow_records_the_difference_by_cause_and_applies_nothing() -> None:
    plane = _plane(rollout())
    _xid(plane, "c1-gpu-000", 13)  # the candidate would reset the GPU
    _xid(plane, "c1-gpu-001", 79)  # both tables reboot: no difference
    diff = _view(plane)["diff"]
    assert diff["causes"] == [CAUSE]
    assert diff["evaluated"] == 2 and diff["differing"] == 1
    [row] = diff["rows"]
    assert row["active"] == {"failureMode": CAUSE, "action": "restart_job"}
    assert row["candidate"] == {"failureMode": CAUSE, "action": "reset_gpu"}
    assert row["nodes"] == ["c1-gpu-000"]
    # applied: only the active table's reboot of the XID 79 node, no GPU reset anywhere
    assert [(n, a) for n, a, _ in plane.compute.repairs] == [("c1-gpu-001", RepairAction.REBOOT)]
    assert _view(plane)["recommendations"] == []


def test_without_a_candidate_nothing_is_recorded() -> None:
    plane = Plane().up()
    _xid(plane, "c1-gpu-000", 13)
    view = _view(plane)
    assert view["policy"] is None and view["recommendations"] == []
    assert view["diff"]["evaluated"] == 0 and view["repairDiff"]["evaluated"] == 0
    with plane.uow() as uow:
        assert uow.records(triage_policy.SHADOW, {}) == []  # nothing written either


def test_recommend_waits_for_the_operator_and_accept_repairs_through_the_guard() -> None:
    plane = _plane(rollout({"stage": "recommend", "cause": CAUSE}))
    _xid(plane, "c1-gpu-000", 13)
    assert plane.compute.repairs == []  # recommend-only applies nothing by itself
    [rec] = _view(plane)["recommendations"]
    assert rec["verdict"] == "pending" and rec["nodeId"] == "c1-gpu-000"
    assert rec["deadline"] == rec["createdAt"] + 3600
    _xid(plane, "c1-gpu-000", 13)  # the same fault again: still one recommendation
    assert len(_view(plane)["recommendations"]) == 1

    plane.api(lambda u, d: triage_policy.decide(u, d, "c1", rec["id"], "accept",
                                                "seen this GPU before", "token:ops"))
    plane.deliver()
    assert [(n, a) for n, a, _ in plane.compute.repairs] == [("c1-gpu-000",
                                                              RepairAction.RESET_GPU)]
    [done] = _view(plane)["recommendations"]
    assert (done["verdict"], done["by"], done["reason"]) == ("accepted", "token:ops",
                                                             "seen this GPU before")
    acted = [e.event for e in plane.delivered if isinstance(e.event, NodeOperatorActed)]
    assert acted and acted[-1].action == "recommendation:accepted"
    # a repeat is answered, a contrary decision refused
    plane.api(lambda u, d: triage_policy.decide(u, d, "c1", rec["id"], "accept",
                                                "seen this GPU before", "token:ops"))
    try:
        plane.api(lambda u, d: triage_policy.decide(u, d, "c1", rec["id"], "dismiss",
                                                    "changed my mind", "token:ops"))
    except Conflict as exc:
        assert "already accepted" in str(exc)
    else:
        raise AssertionError("a decided recommendation was decided again")


def test_dismiss_records_the_reason_and_repairs_nothing() -> None:
    plane = _plane(rollout({"stage": "recommend", "cause": CAUSE}))
    _xid(plane, "c1-gpu-000", 13)
    [rec] = _view(plane)["recommendations"]
    plane.api(lambda u, d: triage_policy.decide(u, d, "c1", rec["id"], "dismiss",
                                                "a known driver bug", "token:ops"))
    plane.deliver()
    assert plane.compute.repairs == []
    [done] = _view(plane)["recommendations"]
    assert (done["verdict"], done["reason"]) == ("dismissed", "a known driver bug")


def _tick(plane: Plane) -> None:
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()


def test_a_recommendation_times_out_to_the_configured_default() -> None:
    for default, verdict, repairs in (("dismiss", "dismissed", []),
                                      ("accept", "accepted", [("c1-gpu-000",
                                                               RepairAction.RESET_GPU)])):
        plane = _plane(rollout({"stage": "recommend", "cause": CAUSE},
                               recommendTimeoutS=30, timeoutDefault=default))
        _xid(plane, "c1-gpu-000", 13)
        plane.clock.advance(25)  # (inside the heartbeat timeout: no other fault arises)
        _tick(plane)
        assert _view(plane)["recommendations"][0]["verdict"] == "pending"
        plane.clock.advance(10)
        _tick(plane)
        [done] = _view(plane)["recommendations"]
        assert (done["verdict"], done["by"]) == (verdict, "timeout"), default
        assert [(n, a) for n, a, _ in plane.compute.repairs] == repairs, default


def test_active_is_staged_by_partition() -> None:
    plane = _plane(rollout({"stage": "active", "partition": "other"}))
    _xid(plane, "c1-gpu-000", 13)
    assert plane.compute.repairs == []  # "train" is still in shadow
    plane.api(lambda u, d: triage_policy.configure(
        u, "c1", rollout({"stage": "active", "partition": "train"}), "token:ops",
        plane.clock.now()))
    _xid(plane, "c1-gpu-001", 13)
    assert [(n, a) for n, a, _ in plane.compute.repairs] == [("c1-gpu-001",
                                                              RepairAction.RESET_GPU)]
    assert _view(plane)["diff"]["differing"] == 2  # the same candidate: the report goes on


def test_a_lasting_fault_is_counted_once_and_still_decided_by_its_stage() -> None:
    plane = _plane(rollout({"stage": "recommend", "cause": CAUSE}))
    plane.clock.advance(5)
    fault = xid(13, plane.clock.now())
    for _ in range(3):  # the agent reports the same fault (same since) again and again
        plane.report("c1-gpu-000", fault)
        plane.deliver()
        plane.clock.advance(2)
    diff = _view(plane)["diff"]
    assert (diff["evaluated"], diff["differing"]) == (1, 1)
    assert len(_view(plane)["recommendations"]) == 1


def test_an_operators_row_for_an_unknown_error_code_is_shadowed_like_any_row() -> None:
    """Custom remediation: the packaged table does not know XID 23; the operator's row
    resets the GPU. Active, the node gets that repair; in shadow, the difference is named."""
    policy = rollout({"stage": "active", "cause": "unmapped_xid", "partition": "train"})
    policy["candidate"]["xid"]["rules"].append(
        {"codes": [23], "failure_mode": "operator_xid_23", "severity": "critical",
         "action": "reset_gpu"})
    plane = _plane(policy)
    _xid(plane, "c1-gpu-000", 23)
    [row] = _view(plane)["diff"]["rows"]
    assert row["cause"] == "unmapped_xid"  # what the active table calls it
    assert row["candidate"] == {"failureMode": "operator_xid_23", "action": "reset_gpu"}
    assert [(n, a) for n, a, _ in plane.compute.repairs] == [("c1-gpu-000",
                                                              RepairAction.RESET_GPU)]


def test_a_candidate_repair_configuration_is_shadowed_and_never_applied() -> None:
    """A stricter guard (nothing may leave service) would hold the reboot the active one
    runs: the difference is named by cause and step; the reboot still runs."""
    plane = _plane({"repair": {"max_out_of_service_fraction": 0.0,
                               "min_out_of_service_allowed": 0}})
    _xid(plane, "c1-gpu-000", 79)
    assert [(n, a) for n, a, _ in plane.compute.repairs] == [("c1-gpu-000",
                                                              RepairAction.REBOOT)]
    view = _view(plane)
    [row] = view["repairDiff"]["rows"]
    assert (row["cause"], row["active"], row["candidate"]) == (
        "gpu_fell_off_bus", {"step": "repair", "action": "reboot"},
        {"step": "hold", "action": "reboot"})
    assert view["diff"]["evaluated"] == 0  # no candidate table: triage ran the active alone
    text = metrics.render(metrics.registry(plane.store, plane.clock)).decode()
    assert ('mtc_repair_shadow_differences{active_step="repair reboot",candidate_step='
            '"hold reboot",cause="gpu_fell_off_bus",cluster="c1"} 1.0') in text


def test_accepting_after_the_node_was_repaired_applies_nothing() -> None:
    plane = _plane(rollout({"stage": "recommend", "cause": CAUSE}))
    _xid(plane, "c1-gpu-000", 13)
    [rec] = _view(plane)["recommendations"]
    _xid(plane, "c1-gpu-000", 79)  # the active table reboots it meanwhile
    plane.finish_repairs()
    assert [(n, a) for n, a, _ in plane.compute.repairs] == []
    plane.api(lambda u, d: triage_policy.decide(u, d, "c1", rec["id"], "accept", "late",
                                                "token:ops"))
    plane.deliver()
    assert plane.compute.repairs == []  # the repaired node is not taken out for the old fault
    [done] = _view(plane)["recommendations"]
    assert done["verdict"] == "accepted" and "repaired since" in done["reason"]


def test_a_deleted_cluster_takes_its_candidate_with_it() -> None:
    """Created again under the same id, a cluster must not inherit a candidate (an active
    stage would decide for it unseen)."""
    plane = _plane(rollout({"stage": "active"}))
    _xid(plane, "c1-gpu-000", 13)
    plane.api(lambda u, d: job_commands.delete_cluster("c1", u, d))
    plane.deliver()
    view = _view(plane)
    assert view["policy"] is None and view["diff"]["evaluated"] == 0
