"""Conditions are state, events are changes: repeats refresh "last seen" only, alerts are
raised once (and per reminder), heartbeat loss is raised once, old records are pruned."""

from __future__ import annotations

from dataclasses import replace

from shared.adapters.docstore import EVENTS, PROCESSED
from shared.config import ControlPlaneConfig
from shared.domain.events import FleetTicked, NodeDiagnosed, NodeHealthReported, NodeRepairHeld
from shared.domain.model import NodeState
from tests.harness import Plane, healthy, xid

NODE = "c1-gpu-001"


def ready_plane(config: ControlPlaneConfig | None = None) -> Plane:
    return Plane(config).up()


def held_config(**kw: float) -> ControlPlaneConfig:
    base = ControlPlaneConfig()
    repair = replace(base.repair, max_out_of_service_fraction=0.0, min_out_of_service_allowed=0)
    return replace(base, repair=repair, **kw)  # type: ignore[arg-type]


def of_type(plane: Plane, cls: type) -> list[object]:
    return [e for e in plane.delivered if e.type == cls.TYPE]


def logged(plane: Plane) -> int:
    return len(plane.store.data[EVENTS])


def test_a_repeated_healthy_report_refreshes_last_seen_only() -> None:
    plane = ready_plane()
    conditions = healthy(plane.clock.now())
    plane.report(NODE, conditions)
    plane.deliver()
    events, records = logged(plane), len(plane.store.data[PROCESSED])
    for _ in range(5):
        plane.clock.advance(1)
        plane.report(NODE, conditions)
        plane.deliver()
    assert logged(plane) == events  # not in the timeline
    assert len(plane.store.data[PROCESSED]) == records  # no record a heartbeat
    node = plane.node(NODE)
    assert node.last_report_at == plane.clock.now()
    assert all(c.last_seen == plane.clock.now() for c in node.conditions.values())


def test_a_held_node_alerts_once_then_per_reminder() -> None:
    plane = ready_plane(held_config(alert_reminder_s=600.0))
    fault = xid(79, plane.clock.now())
    for _ in range(120):  # the agent reports the same fault every second
        plane.report(NODE, fault)
        plane.deliver()
        plane.clock.advance(1)
    assert plane.node(NODE).state is NodeState.SUSPECT
    assert len(of_type(plane, NodeDiagnosed)) == 1
    assert len(of_type(plane, NodeRepairHeld)) == 1
    plane.clock.advance(600)
    plane.report(NODE, fault)
    plane.deliver()
    assert len(of_type(plane, NodeDiagnosed)) == 2  # re-planned once per reminder
    assert len(of_type(plane, NodeRepairHeld)) == 2


def test_a_changed_fault_is_diagnosed_again_at_once() -> None:
    plane = ready_plane(held_config())
    plane.report(NODE, xid(79, plane.clock.now()))
    plane.deliver()
    plane.clock.advance(1)
    plane.report(NODE, xid(48, plane.clock.now()))
    plane.deliver()
    assert len(of_type(plane, NodeDiagnosed)) == 2


def test_heartbeat_loss_is_raised_once_by_the_tick() -> None:
    plane = ready_plane(held_config(heartbeat_timeout_s=30.0))
    for _ in range(10):
        plane.clock.advance(10)
        plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
        plane.deliver()
    diagnosed = [e for e in of_type(plane, NodeDiagnosed)]
    workers = [n for n in plane.nodes("c1") if n.node_id != "c1-login"]
    assert len(diagnosed) == len(workers)  # once per silent node, not once per tick
    assert all(n.conditions["HeartbeatLost"].status == "true" for n in workers)
    plane.report(NODE, healthy(plane.clock.now()))
    plane.deliver()
    assert plane.node(NODE).conditions["HeartbeatLost"].status == "false"


def test_event_log_and_idempotency_records_are_pruned_on_schedule() -> None:
    config = replace(ControlPlaneConfig(), retention_s=100.0, idempotency_retention_s=50.0,
                     max_event_age_s=50.0, prune_interval_s=10.0)
    plane = ready_plane(config)
    assert logged(plane) and plane.store.data[PROCESSED]
    plane.clock.advance(200)
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()
    horizon = plane.clock.now() - 100.0
    assert all(d["time"] >= horizon for d in plane.store.data[EVENTS].values())
    assert all(d["time"] >= plane.clock.now() - 50.0
               for d in plane.store.data[PROCESSED].values())
    assert all("expire_at" in d for d in plane.store.data[PROCESSED].values())


def test_the_bus_keeps_one_waiting_repeat_report_per_node() -> None:
    plane = ready_plane()
    delivered = len(of_type(plane, NodeHealthReported))
    conditions = healthy(plane.clock.now())
    for _ in range(3):
        plane.clock.advance(1)
        plane.report(NODE, conditions)  # the same state, not yet delivered
    plane.report(NODE, xid(79, plane.clock.now()))  # a change is always queued
    plane.deliver()
    assert len(of_type(plane, NodeHealthReported)) - delivered == 2  # one repeat, the fault


def test_a_failed_node_is_reminded_by_the_tick_not_every_tick() -> None:
    plane = ready_plane(replace(ControlPlaneConfig(), alert_reminder_s=600.0,
                                heartbeat_timeout_s=1e9))
    plane.report(NODE, xid(54, plane.clock.now()))  # the catalog: a person must act
    plane.deliver()
    assert plane.node(NODE).state is NodeState.FAILED
    assert len(of_type(plane, NodeRepairHeld)) == 1  # raised once, by repair
    for _ in range(5):  # ticks inside the reminder interval stay quiet
        plane.clock.advance(100)
        plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
        plane.deliver()
    assert len(of_type(plane, NodeRepairHeld)) == 1
    plane.clock.advance(100)
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()
    reminders = of_type(plane, NodeRepairHeld)
    assert len(reminders) == 2  # one reminder once the interval has passed
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()
    assert len(of_type(plane, NodeRepairHeld)) == 2
