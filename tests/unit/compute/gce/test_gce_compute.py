"""GceCompute through the real google-cloud-compute client against the Compute Engine
stand-in (tests/gce_standin.py: no emulator exists). What could go wrong: the resource sent
(provisioning model, GPUs, reservations), the steps of each repair, the reason a replace
reports, stock-outs and quota treated as failures, retries applied twice, operations that
never end, maintenance noticed too late or reported on every poll, a crash mid-operation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials

from shared.adapters.compute.gce.api import (
    Failure,
    GceApi,
    GceConfig,
    GceError,
    PoolSettings,
    classify,
    fault_behavior,
    instance_name,
    operation_error,
)
from shared.adapters.compute.gce.compute import GceCompute
from shared.domain.events import AlertRaised, NodeHealthReported, NodeProvisioned, NodeRepairCompleted
from shared.domain.health import COMPUTE_SOURCE, Condition, HealthReport, RepairAction
from shared.policies.triage import triage
from shared.policies.triage_table import load_triage_table
from tests.contract.compute_drivers import make_node
from tests.gce_standin import ComputeStandin, Inject
from tests.harness import ManualClock, Recorder

POOLS = {"pool": PoolSettings(provisioning_model="SPOT"),
         "flex": PoolSettings(provisioning_model="FLEX_START", max_run_duration_s=7 * 86400),
         "resv": PoolSettings(reservation="h100-block-1")}


@pytest.fixture
def standin() -> Iterator[ComputeStandin]:
    server = ComputeStandin().start()
    yield server
    server.close()


class Rig:
    def __init__(self, tmp: Path, standin: ComputeStandin, **kw: float) -> None:
        self.tmp, self.standin = tmp, standin
        self.clock = ManualClock(1000.0)
        self.events = Recorder()
        self.config = GceConfig("proj", "us-central1-a", pools=POOLS)
        self.gce = self.make(**kw)

    def make(self, **kw: float) -> GceCompute:
        api = GceApi(self.config, api_endpoint=self.standin.endpoint,
                     credentials=AnonymousCredentials())
        opts = {"retry_initial_s": 1.0, "capacity_initial_s": 30.0, "watch_interval_s": 60.0,
                "operation_timeout_s": 300.0, **kw}
        return GceCompute(self.tmp / "state", self.events, self.clock, api, **opts)

    def run(self, seconds: float, step: float = 1.0) -> None:
        t = 0.0
        while t < seconds:
            self.clock.advance(step)
            self.gce.poll()
            t += step

    def up(self, node_id: str, pool: str = "pool") -> None:
        node = make_node(node_id)
        node.pool = pool
        self.gce.provision_node(node)
        self.run(5)
        assert [e.ok for e in self.events.of(NodeProvisioned) if e.node_id == node_id] == [True]

    def instance(self, node_id: str) -> dict:
        inst = self.standin.instance(instance_name(self.config, node_id))
        assert inst is not None
        return inst


@pytest.fixture
def rig(tmp_path: Path, standin: ComputeStandin) -> Iterator[Rig]:
    made = Rig(tmp_path, standin)
    yield made
    made.gce.close()


def test_the_instance_carries_the_pools_provisioning_model_gpus_and_reservation(rig: Rig) -> None:
    rig.up("w0", "pool")
    rig.up("w1", "flex")
    rig.up("w2", "resv")
    spot, flex, resv = (rig.instance(n) for n in ("w0", "w1", "w2"))
    assert spot["scheduling"]["provisioningModel"] == "SPOT"
    assert spot["scheduling"]["automaticRestart"] is False
    assert spot["guestAccelerators"] == [{
        "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-h100-80gb",
        "acceleratorCount": 8}]
    assert spot["machineType"] == "zones/us-central1-a/machineTypes/a3-highgpu-8g"
    assert flex["scheduling"]["provisioningModel"] == "FLEX_START"
    assert flex["scheduling"]["maxRunDuration"] == {"seconds": str(7 * 86400)}
    assert resv["scheduling"]["provisioningModel"] == "STANDARD"
    assert resv["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name", "values": ["h100-block-1"]}
    assert all(i["scheduling"]["onHostMaintenance"] == "TERMINATE" for i in (spot, flex, resv))
    # a provisioned node reports what Compute Engine knows: no maintenance pending
    [report] = [e for e in rig.events.of(NodeHealthReported) if e.node_id == "w0"]
    assert report.source == COMPUTE_SOURCE
    assert report.conditions[0]["type"] == "UpcomingMaintenance"
    assert report.conditions[0]["status"] == "false"


def test_a_repeated_provision_and_a_retried_call_are_one_instance(rig: Rig) -> None:
    rig.standin.fail_next("insert", Inject(http_status=503, reason="backendError"))
    node = make_node("w0")
    rig.gce.provision_node(node)
    rig.gce.provision_node(node)
    rig.run(10)
    assert len(rig.standin.calls("insert")) == 2  # the 503, then the retry
    assert len(rig.events.of(NodeProvisioned)) == 1
    assert rig.events.of(NodeProvisioned)[0].ok


@pytest.mark.parametrize("inject", [
    Inject(op_code="ZONE_RESOURCE_POOL_EXHAUSTED", message="The zone does not have enough"
           " resources available to fulfill the request."),
    Inject(http_status=403, reason="quotaExceeded", message="Quota 'NVIDIA_H100_GPUS' exceeded."),
], ids=["stock-out", "quota"])
def test_stock_outs_and_quota_are_a_visible_capacity_wait_not_a_failure(
        rig: Rig, inject: Inject) -> None:
    rig.standin.fail_next("insert", inject, times=3)
    rig.gce.provision_node(make_node("w0"))
    rig.run(60)
    assert rig.events.of(NodeProvisioned) == []  # no failure reported
    [wait] = rig.gce.waits()
    assert (wait.node_id, wait.kind) == ("w0", "provision")
    assert "exhausted" in wait.detail.lower() or "quota" in wait.detail.lower()
    firing = [e for e in rig.events.of(AlertRaised) if e.state == "firing"]
    assert [(e.kind, e.node_id) for e in firing] == [("capacity_wait", "w0")]
    rig.run(400, step=10.0)  # backoff 30 s, 60 s, 120 s: the fourth try gets the machine
    assert [e.ok for e in rig.events.of(NodeProvisioned)] == [True]
    assert rig.gce.waits() == []
    assert [e.state for e in rig.events.of(AlertRaised)] == ["firing", "resolved"]
    assert len(rig.standin.calls("insert")) == 4


def test_a_permanent_error_fails_the_provisioning_once(rig: Rig) -> None:
    rig.standin.fail_next("insert", Inject(http_status=400, reason="invalid",
                                           message="Invalid value for field 'machineType'"))
    rig.gce.provision_node(make_node("w0"))
    rig.run(20)
    [failed] = rig.events.of(NodeProvisioned)
    assert not failed.ok and "machineType" in failed.detail
    assert [a.kind for a in rig.gce.alerts()] == ["gce-provision-failed"]


def test_an_operation_past_its_deadline_fails_and_an_outage_fails_nothing(rig: Rig) -> None:
    rig.standin.state.down = True
    rig.gce.provision_node(make_node("w0"))
    rig.run(600, step=10.0)  # the API answers 503 for ten minutes: retried, never failed
    assert rig.events.of(NodeProvisioned) == []
    rig.standin.state.down = False
    rig.standin.state.frozen = True  # the operation is accepted but never ends
    rig.run(200, step=10.0)
    assert rig.events.of(NodeProvisioned) == []
    rig.run(200, step=10.0)  # operation_timeout_s = 300
    [failed] = rig.events.of(NodeProvisioned)
    assert not failed.ok and "not done after 300s" in failed.detail


@pytest.mark.parametrize(("action", "verbs"), [
    (RepairAction.RESET_GPU, ["reset"]),
    (RepairAction.REBOOT, ["stop", "start"]),
    (RepairAction.REIMAGE, ["delete", "insert"]),
    (RepairAction.REPLACE, ["reportHostAsFaulty", "delete", "insert"]),
])
def test_each_repair_runs_its_steps_once_and_completes_with_a_post_repair_check(
        rig: Rig, action: RepairAction, verbs: list[str]) -> None:
    rig.up("w0")
    before = rig.instance("w0")
    rig.standin.state.calls.clear()
    rig.gce.cordon("w0", "XidError: xid 79 (GPU has fallen off the bus)")
    rig.gce.start_repair("w0", action, 1)
    rig.gce.start_repair("w0", RepairAction.REBOOT, 1)  # the same key: nothing more
    rig.run(10)
    assert [v for v, _ in rig.standin.calls()] == verbs
    [done] = rig.events.of(NodeRepairCompleted)
    assert (done.action, done.attempt, done.ok) == (action.value, 1, True)
    post = rig.events.events[rig.events.events.index(done) + 1]
    assert isinstance(post, NodeHealthReported) and post.source == "post-repair-check"
    after = rig.instance("w0")
    assert after["status"] == "RUNNING"
    recreated = action in (RepairAction.REIMAGE, RepairAction.REPLACE)
    assert (after["id"] != before["id"]) is recreated
    if action is RepairAction.REPLACE:
        [fault] = rig.standin.state.faults_reported
        assert fault["disruptionSchedule"] == "IMMEDIATE"
        assert fault["faultReasons"] == [{
            "behavior": "UNRECOVERABLE_GPU_ERROR",
            "description": "XidError: xid 79 (GPU has fallen off the bus)"}]


def test_planned_maintenance_is_reported_once_and_triage_moves_the_job_before_it(rig: Rig) -> None:
    rig.up("w0")
    name = instance_name(rig.config, "w0")
    rig.standin.schedule_maintenance(name, "2026-12-02T03:00:00Z")
    rig.run(180, step=5.0)  # three watch intervals: one report, on the change
    reports = [e for e in rig.events.of(NodeHealthReported) if e.node_id == "w0"][1:]
    [report] = reports
    [cond] = report.conditions
    assert (cond["type"], cond["status"], report.source) == (
        "UpcomingMaintenance", "true", COMPUTE_SOURCE)
    assert cond["details"]["window_start"] == "2026-12-02T03:00:00Z"
    health = HealthReport("w0", report.observed_at,
                          tuple(Condition.from_dict(c) for c in report.conditions), report.source)
    diagnosis = triage(health, (), report.observed_at, load_triage_table())
    assert (diagnosis.failure_mode, diagnosis.action) == ("planned_maintenance",
                                                          RepairAction.REBOOT)
    # the reboot (stop, start) puts the VM on another host: the notice is gone
    rig.gce.start_repair("w0", RepairAction.REBOOT, 1)
    rig.run(10)
    post = [e for e in rig.events.of(NodeHealthReported) if e.source == "post-repair-check"]
    assert [c["status"] for c in post[0].conditions] == ["false"]


def lost_reports(rig: Rig, node_id: str) -> list[dict[str, object]]:
    return [c for e in rig.events.of(NodeHealthReported) if e.node_id == node_id
            for c in e.conditions if c["type"] == "PreemptionNotice"]


def test_a_preempted_spot_vm_is_reported_once_and_triage_replaces_it(rig: Rig) -> None:
    rig.up("w0")  # pool "pool" is SPOT
    rig.run(120, step=10.0)
    assert lost_reports(rig, "w0") == []  # a serving VM says nothing of preemption
    rig.standin.preempt(instance_name(rig.config, "w0"))
    rig.run(240, step=10.0)  # four watch intervals: one report, on the change
    [cond] = lost_reports(rig, "w0")
    assert (cond["status"], cond["details"]["kind"], cond["details"]["notice_s"]) == (
        "true", "preempted", 0.0)
    report = next(e for e in rig.events.of(NodeHealthReported)
              if any(c["type"] == "PreemptionNotice" for c in e.conditions))
    health = HealthReport("w0", report.observed_at,
                          tuple(Condition.from_dict(c) for c in report.conditions), report.source)
    diagnosis = triage(health, (), report.observed_at, load_triage_table())
    assert (diagnosis.failure_mode, diagnosis.action) == ("preemption_notice",
                                                          RepairAction.REPLACE)


def test_an_instance_gone_behind_mtcs_back_is_reported_and_cleared_when_it_serves_again(
        rig: Rig) -> None:
    rig.up("w1", pool="resv")  # STANDARD with a reservation: not preemptible
    rig.standin.lose(instance_name(rig.config, "w1"))
    rig.run(120, step=10.0)
    [cond] = lost_reports(rig, "w1")
    assert (cond["status"], cond["details"]["kind"]) == ("true", "gone")
    rig.gce.start_repair("w1", RepairAction.REPLACE, 1)  # recreated from the template
    rig.run(240, step=5.0)
    assert [c["status"] for c in lost_reports(rig, "w1")] == ["true", "false"]


def test_delete_removes_the_instance_and_a_deleted_node_is_left_alone(rig: Rig) -> None:
    rig.up("w0")
    rig.gce.delete_node("w0")
    rig.gce.delete_node("w0")
    rig.run(10)
    assert rig.standin.instance(instance_name(rig.config, "w0")) is None
    assert len(rig.standin.calls("delete")) == 1
    rig.run(120, step=10.0)
    assert rig.gce.alerts() == []
    rig.gce.provision_node(make_node("w0"))  # a new life (a power-saved node resumed)
    rig.run(5)
    rig.gce.delete_node("w0")
    rig.gce.provision_node(make_node("w0"))  # asked at once: it waits for the delete
    rig.run(10)
    assert [v for v, _ in rig.standin.calls()][-2:] == ["delete", "insert"]
    assert rig.standin.instance(instance_name(rig.config, "w0")) is not None
    assert [e.ok for e in rig.events.of(NodeProvisioned)] == [True, True, True]


def test_a_new_process_carries_on_with_the_operation_in_flight(rig: Rig) -> None:
    rig.gce.provision_node(make_node("w0"))
    rig.clock.advance(1)
    rig.gce.poll()  # insert issued, its operation PENDING
    assert rig.gce.tasks("w0")[0]["op"]
    rig.gce.close()
    rig.gce = rig.make()  # the executor restarted
    rig.run(5)
    assert [e.ok for e in rig.events.of(NodeProvisioned)] == [True]
    assert len(rig.standin.calls("insert")) == 1


def test_errors_are_classified() -> None:
    from google.api_core import exceptions as gexc

    assert classify(gexc.ServiceUnavailable("down")).kind is Failure.TRANSIENT
    assert classify(gexc.TooManyRequests("slow down")).kind is Failure.TRANSIENT
    assert classify(ConnectionRefusedError("refused")).kind is Failure.TRANSIENT
    assert classify(gexc.BadRequest("bad")).kind is Failure.PERMANENT
    assert classify(gexc.Forbidden("Quota 'GPUS' exceeded", errors=[
        {"reason": "quotaExceeded"}])).kind is Failure.CAPACITY
    assert operation_error({"status": "DONE"}) is None
    stockout = operation_error({"error": {"errors": [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED"}]}})
    assert isinstance(stockout, GceError) and stockout.kind is Failure.CAPACITY
    other = operation_error({"error": {"errors": [{"code": "INVALID_FIELD_VALUE"}]}})
    assert other is not None and other.kind is Failure.PERMANENT
    assert fault_behavior("SlowSpeedCheck: 0.4 of baseline") == "PERFORMANCE"
    assert fault_behavior("operator said so") == "BEHAVIOR_UNSPECIFIED"


def test_instance_names_are_valid_and_stable() -> None:
    config = GceConfig("p", "z")
    assert instance_name(config, "demo-H100_000") == "mtc-demo-h100-000"
    long = instance_name(config, "x" * 100)
    assert len(long) <= 63 and long == instance_name(config, "x" * 100)
    assert instance_name(GceConfig("p", "z", name_prefix=""), "0abc").startswith("n-")
