"""Simulated nodes: provisioning, faults, repairs, heartbeats, once-only events."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from local_compute_support import FakeClock

from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.local.faults import clears, required_action
from shared.adapters.compute.local.nodes import HEALTHY_REASON
from shared.domain.events import NodeHealthReported, NodeProvisioned, NodeRepairCompleted
from shared.domain.health import Condition, ConditionStatus, ConditionType, RepairAction
from shared.domain.model import Node, NodeRole, NodeState
from shared.ports import SoftwareImages
from tests.harness import Recorder

RA = RepairAction
CT = ConditionType


def node(node_id: str = "n1") -> Node:
    return Node(
        node_id=node_id,
        cluster_id="c1",
        pool="gpu",
        partition="p1",
        role=NodeRole.WORKER,
        machine_type="a3-highgpu-8g",
        accelerator_type="nvidia-h100-80gb",
        accelerator_count=8,
        state=NodeState.PROVISIONING,
        since=0.0,
    )


def fault(ctype: str, since: float = 1000.0, **details: Any) -> Condition:
    return Condition(ctype, ConditionStatus.TRUE, "injected", since, details)


def by_type(report: NodeHealthReported) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in report.conditions}


def true_types(report: NodeHealthReported) -> set[str]:
    return {c["type"] for c in report.conditions if c["status"] == "true"}


@pytest.fixture
def up(make_compute: Callable[..., LocalCompute], recorder: Recorder) -> LocalCompute:
    """One provisioned node n1, its start-up events cleared."""
    compute = make_compute()
    compute.provision_node(node())
    compute.poll()
    recorder.events.clear()
    return compute


def test_provisioning_completes_after_its_duration_with_a_healthy_first_report(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    compute = make_compute(provision_duration_s=5.0)
    compute.provision_node(node())
    compute.provision_node(node())  # idempotent
    clock.advance(4.9)
    compute.poll()
    assert recorder.events == []
    clock.advance(0.1)
    compute.poll()
    compute.poll()
    provisioned, report = recorder.events
    assert provisioned == NodeProvisioned("n1", ok=True, detail="simulated local node")
    assert isinstance(report, NodeHealthReported)
    assert report.source == "agent" and report.observed_at == clock.now()
    assert {c["type"] for c in report.conditions} == {t.value for t in ConditionType}
    assert all(c["status"] == "false" for c in report.conditions)
    assert {(c["reason"], c["since"]) for c in report.conditions} == {(HEALTHY_REASON, clock.now())}


def test_injected_fault_is_reported_at_once_and_persists_in_heartbeats(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    compute = make_compute(heartbeats=True, agent_interval_s=10.0)
    compute.provision_node(node())
    compute.poll()
    recorder.events.clear()
    compute.inject_fault("n1", [fault(CT.XID_ERROR, xids=[79])])
    (report,) = recorder.of(NodeHealthReported)
    assert true_types(report) == {CT.XID_ERROR}
    assert by_type(report)[CT.XID_ERROR]["details"]["xids"] == [79]
    clock.advance(9.9)
    compute.poll()
    assert len(recorder.events) == 1  # no heartbeat before the interval
    clock.advance(0.1)
    compute.poll()
    compute.poll()
    heartbeats = recorder.of(NodeHealthReported)[1:]
    assert len(heartbeats) == 1
    assert heartbeats[0].source == "agent" and true_types(heartbeats[0]) == {CT.XID_ERROR}


def test_repair_completes_after_its_duration_and_clears_only_what_it_can_fix(
    up: LocalCompute, clock: FakeClock, recorder: Recorder
) -> None:
    up.inject_fault("n1", [fault(CT.XID_ERROR, xids=[79])])  # fell off the bus: needs a reboot
    recorder.events.clear()
    up.start_repair("n1", RA.RESET_GPU, attempt=1)
    clock.advance(0.4)
    up.poll()
    assert recorder.events == []
    clock.advance(0.1)
    up.poll()
    done, check = recorder.events
    assert done == NodeRepairCompleted("n1", "reset_gpu", 1, True, "cleared 0 fault(s), 1 remain")
    assert isinstance(check, NodeHealthReported) and check.source == "post-repair-check"
    assert true_types(check) == {CT.XID_ERROR}  # the reset did not help: the ladder climbs

    recorder.events.clear()
    up.start_repair("n1", RA.REBOOT, attempt=2)
    clock.advance(1.0)
    up.poll()
    done, check = recorder.events
    assert isinstance(done, NodeRepairCompleted) and done.ok and done.attempt == 2
    assert isinstance(check, NodeHealthReported) and true_types(check) == set()
    assert by_type(check)[CT.XID_ERROR]["reason"] == "cleared by reboot"
    assert by_type(check)[CT.XID_ERROR]["since"] == clock.now()
    assert up.node_faults("n1") == []


def test_a_repair_clears_faults_below_its_rung_and_keeps_those_above(
    up: LocalCompute, clock: FakeClock, recorder: Recorder
) -> None:
    up.inject_fault(
        "n1",
        [fault(CT.ECC_UNCORRECTABLE, volatile_dbe=1), fault(CT.DISK_PRESSURE, used_fraction=0.99)],
    )
    up.start_repair("n1", RA.REBOOT, attempt=1)
    clock.advance(1.0)
    up.poll()
    check = recorder.of(NodeHealthReported)[-1]
    assert true_types(check) == {CT.DISK_PRESSURE}  # reboot fixes ECC, not a full disk
    up.start_repair("n1", RA.REIMAGE, attempt=2)
    clock.advance(2.0)
    up.poll()
    assert true_types(recorder.of(NodeHealthReported)[-1]) == set()


def test_manual_repair_never_completes(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    compute = make_compute(repair_durations_s={RA.MANUAL: 1.0})
    compute.provision_node(node())
    compute.poll()
    compute.start_repair("n1", RA.MANUAL, attempt=1)
    clock.advance(1e7)
    compute.poll()
    assert recorder.of(NodeRepairCompleted) == []


def test_start_repair_is_idempotent_on_node_and_attempt(
    up: LocalCompute, clock: FakeClock, recorder: Recorder
) -> None:
    up.start_repair("n1", RA.REBOOT, attempt=1)
    clock.advance(0.5)
    up.start_repair("n1", RA.REBOOT, attempt=1)  # a redelivered request: same deadline
    up.start_repair("n1", RA.REPLACE, attempt=1)  # same key, other action: still a no-op
    clock.advance(0.5)
    up.poll()
    up.poll()
    (done,) = recorder.of(NodeRepairCompleted)
    assert (done.action, done.attempt) == ("reboot", 1)


def test_custom_repair_durations(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    compute = make_compute(repair_durations_s={RA.REBOOT: 30.0})
    compute.provision_node(node())
    compute.start_repair("n1", RA.REBOOT, attempt=1)
    clock.advance(29.0)
    compute.poll()
    assert recorder.of(NodeRepairCompleted) == []
    clock.advance(1.0)
    compute.poll()
    assert len(recorder.of(NodeRepairCompleted)) == 1


def test_application_class_xid_is_reported_once_and_not_kept(
    up: LocalCompute, recorder: Recorder
) -> None:
    up.inject_fault("n1", [fault(CT.XID_ERROR, xids=[13])])
    assert true_types(recorder.of(NodeHealthReported)[0]) == {CT.XID_ERROR}
    assert up.node_faults("n1") == []


def test_xid_faults_accumulate_in_one_condition(up: LocalCompute, recorder: Recorder) -> None:
    up.inject_fault("n1", [fault(CT.XID_ERROR, xids=[48], gpus=["0000:01:00.0"])])
    up.inject_fault("n1", [fault(CT.XID_ERROR, since=1001.0, xids=[79], gpus=["0000:02:00.0"])])
    xid = by_type(recorder.of(NodeHealthReported)[-1])[CT.XID_ERROR]
    assert xid["details"]["xids"] == [48, 79]
    assert xid["details"]["gpus"] == ["0000:01:00.0", "0000:02:00.0"]
    assert xid["since"] == 1000.0


def test_fault_on_unknown_node_is_an_error(up: LocalCompute) -> None:
    with pytest.raises(LookupError, match="nope"):
        up.inject_fault("nope", [fault(CT.ECC_UNCORRECTABLE)])
    with pytest.raises(ValueError, match="clears_with"):
        up.inject_fault("n1", [fault(CT.ECC_UNCORRECTABLE, clears_with="magic")])


def test_heartbeats_every_interval_until_deleted(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    compute = make_compute(heartbeats=True, agent_interval_s=1.0)
    compute.provision_node(node("n1"))
    compute.provision_node(node("n2"))
    compute.poll()
    recorder.events.clear()
    for _ in range(3):
        clock.advance(1.0)
        compute.poll()
        compute.poll()
    assert [e.node_id for e in recorder.of(NodeHealthReported)] == ["n1", "n2"] * 3
    compute.delete_node("n2")
    recorder.events.clear()
    clock.advance(1.0)
    compute.poll()
    assert [e.node_id for e in recorder.of(NodeHealthReported)] == ["n1"]
    with pytest.raises(LookupError):
        compute.inject_fault("n2", [fault(CT.ECC_UNCORRECTABLE)])


def test_no_heartbeats_when_switched_off(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    compute = make_compute(heartbeats=False)
    compute.provision_node(node())
    compute.poll()
    clock.advance(100.0)
    compute.poll()
    assert len(recorder.of(NodeHealthReported)) == 1  # the first report only


def test_each_fact_is_emitted_once_across_instances_taking_turns(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    first = make_compute(heartbeats=True)
    second = make_compute(heartbeats=True)
    first.provision_node(node())
    second.provision_node(node())
    first.start_repair("n1", RA.RESET_GPU, attempt=1)
    clock.advance(1.0)
    for _ in range(3):
        first.poll()
        second.poll()
    kinds = [type(e).__name__ for e in recorder.events]
    assert kinds == ["NodeProvisioned", "NodeHealthReported", "NodeRepairCompleted",
                     "NodeHealthReported"]  # fmt: skip


def test_an_emit_that_fails_leaves_the_event_for_the_next_poll(
    make_compute: Callable[..., LocalCompute], recorder: Recorder
) -> None:
    failures = [RuntimeError("bus down")]

    def flaky(event: Any) -> None:
        if failures:
            raise failures.pop()
        recorder(event)

    compute = make_compute(emit=flaky)
    compute.provision_node(node())
    with pytest.raises(RuntimeError):
        compute.poll()
    compute.poll()
    compute.poll()
    assert [type(e).__name__ for e in recorder.events] == ["NodeProvisioned", "NodeHealthReported"]


def test_an_emit_may_call_back_into_compute(
    make_compute: Callable[..., LocalCompute], clock: FakeClock, recorder: Recorder
) -> None:
    """An in-process bus runs handlers inside emit; they call compute again (no deadlock)."""
    holder: list[LocalCompute] = []

    def bus(event: Any) -> None:
        recorder(event)
        if isinstance(event, NodeProvisioned):
            holder[0].start_repair(event.node_id, RA.RESET_GPU, attempt=1)

    compute = make_compute(emit=bus)
    holder.append(compute)
    compute.provision_node(node())
    compute.poll()
    clock.advance(0.5)
    compute.poll()
    assert len(recorder.of(NodeRepairCompleted)) == 1


@pytest.mark.parametrize(
    ("condition", "needs"),
    [
        (fault(CT.XID_ERROR, xids=[48]), RA.RESET_GPU),
        (fault(CT.XID_ERROR, xids=[145]), RA.RESET_GPU),
        (fault(CT.XID_ERROR, xids=[79]), RA.REBOOT),
        (fault(CT.XID_ERROR, xids=[154], recovery_action="node_reboot"), RA.REBOOT),
        (fault(CT.XID_ERROR, xids=[48, 79]), RA.REBOOT),
        (fault(CT.XID_ERROR, xids=[54]), RA.REPLACE),
        (fault(CT.XID_ERROR, xids=[13]), RA.NONE),
        (fault(CT.XID_ERROR, xids=[999]), RA.NONE),
        (fault(CT.XID_ERROR), RA.RESET_GPU),
        (fault(CT.ECC_UNCORRECTABLE, volatile_dbe=2), RA.RESET_GPU),
        (fault(CT.ROW_REMAP_FAILURE, pending=True), RA.RESET_GPU),
        (fault(CT.ROW_REMAP_FAILURE, failure=True), RA.REPLACE),
        (fault(CT.DCGM_DIAG_FAILED, level=1), RA.REBOOT),
        (fault(CT.DCGM_DIAG_FAILED, level=2), RA.REIMAGE),
        (fault(CT.DCGM_DIAG_FAILED, level=3), RA.REPLACE),
        (fault(CT.DISK_PRESSURE, used_fraction=0.99), RA.REIMAGE),
        (fault(CT.SLOW_SPEED_CHECK, ratio_to_baseline=0.7), RA.REBOOT),
        (fault(CT.SLOW_SPEED_CHECK, ratio_to_baseline=0.3), RA.REPLACE),
        (fault(CT.HEARTBEAT_LOST), RA.REBOOT),
        (Condition(CT.ECC_UNCORRECTABLE, ConditionStatus.UNKNOWN, "dcgm down", 0.0), RA.REBOOT),
        (fault("SomethingNew"), RA.NONE),
        (fault(CT.ECC_UNCORRECTABLE, clears_with="replace"), RA.REPLACE),
    ],
)
def test_fault_table(condition: Condition, needs: RepairAction) -> None:
    assert required_action(condition) is needs


def test_ladder() -> None:
    assert clears(RA.REBOOT, RA.RESET_GPU) and clears(RA.REPLACE, RA.REIMAGE)
    assert not clears(RA.RESET_GPU, RA.REBOOT)
    assert not clears(RA.MANUAL, RA.RESET_GPU) and not clears(RA.REPLACE, RA.MANUAL)


def test_a_staged_software_version_is_recorded_on_the_node(up: LocalCompute) -> None:
    """``SoftwareImages``: the local stand-in records what the next reimage writes."""
    assert isinstance(up, SoftwareImages)
    up.stage_software("n1", {"driver": "560.35"})
    up.stage_software("n1", {"driver": "560.36", "agent": "2"})  # a newer staging replaces it
    with up.store.tx() as db:
        row = db.execute("SELECT data FROM nodes WHERE node_id = 'n1'").fetchone()
    assert json.loads(row["data"])["staged_software"] == {"driver": "560.36", "agent": "2"}
