"""A scripted rack failure on the in-memory plane: the rack is drained and
repaired as one, once (one DomainDrained, however often the reports come), its job moves to
another rack, and the guard per domain holds a second rack."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from services.job_submission import commands as job_commands
from services.observability import alerts
from shared.config import ControlPlaneConfig
from shared.domain.events import DomainDrained, NodeDiagnosed
from shared.domain.model import JobState, NodeRole, NodeState
from shared.policies.repair import RepairConfig
from tests.harness import Plane, healthy, job_body, xid

RACKS: dict[str, Any] = {
    "clusterId": "c1",
    "nodePools": [{"id": "gpu", "nodeCount": 12, "spareCount": 0,
                   "topology": {"nodesPerRack": 4},
                   "machineSpec": {"machineType": "a3-highgpu-8g",
                                   "acceleratorType": "NVIDIA_H100_80GB",
                                   "acceleratorCount": 8}}],
    "partitions": [{"name": "train", "nodePoolIds": ["gpu"]}],
}
ON = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12,
             repair=RepairConfig(domain_drain_fraction=0.5, max_domains_out=1))


def rack_of(plane: Plane, rack: str) -> list[str]:
    return sorted(n.node_id for n in plane.nodes("c1") if n.rack == rack)


def drained_events(plane: Plane) -> list[DomainDrained]:
    return [env.event for env in plane.delivered if isinstance(env.event, DomainDrained)]


def running_job(plane: Plane, replicas: int = 4) -> list[str]:
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(replicas), u, d, "j1"))
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.RUNNING
    return list(job.node_ids)


def test_nodes_carry_their_rack_and_a_gang_lands_in_one() -> None:
    plane = Plane(ON).up(RACKS)
    workers = [n for n in plane.nodes("c1") if n.role is NodeRole.WORKER]
    assert sorted({n.rack for n in workers}) == ["gpu-rack-0", "gpu-rack-1", "gpu-rack-2"]
    assert all(n.nvlink_domain == n.rack for n in workers)
    placed = running_job(plane, 3)
    assert len({plane.node(n).rack for n in placed}) == 1


def test_a_rack_failure_drains_the_rack_once_and_moves_its_job() -> None:
    plane = Plane(ON).up(RACKS)
    placed = running_job(plane)
    rack = plane.node(placed[0]).rack
    members = rack_of(plane, rack)
    assert sorted(placed) == members  # packed into one rack
    plane.clock.advance(5)
    for node_id in members:  # the rack's power shelf: every node reports, twice over
        plane.report(node_id, xid(79, plane.clock.now()))
        plane.report(node_id, xid(79, plane.clock.now()))
    plane.deliver()
    events = drained_events(plane)
    assert len(events) == 1 and events[0].domain == rack and not events[0].held
    assert all(plane.node(n).state is NodeState.DRAINING for n in members)
    assert plane.compute.signalled == [("j1", 1)]  # one checkpoint-and-stop for the job
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2
    assert not set(job.node_ids) & set(members)
    assert len({plane.node(n).rack for n in job.node_ids}) == 1  # moved whole to another rack
    assert all(plane.node(n).state is NodeState.REPAIRING for n in members)
    with plane.uow() as uow:
        partition = uow.partitions.get("c1", "train")
    assert partition is not None and list(partition.drained_domains) == [rack]
    # the rack comes back: repaired, checked; the rack is whole again
    plane.finish_repairs()
    for _ in range(plane.deps.config.repair.return_after_passes):
        plane.clock.advance(1)
        for node_id in members:
            plane.report(node_id, healthy(plane.clock.now()))
        plane.deliver()
    assert all(plane.node(n).state is NodeState.IDLE for n in members)
    with plane.uow() as uow:
        partition = uow.partitions.get("c1", "train")
    assert partition is not None and partition.drained_domains == {}
    assert len(drained_events(plane)) == 1


def test_one_bad_node_in_a_rack_is_repaired_alone() -> None:
    plane = Plane(ON).up(RACKS)
    plane.report("c1-gpu-000", xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node("c1-gpu-000").state is NodeState.REPAIRING
    assert all(plane.node(n).state is NodeState.IDLE for n in rack_of(plane, "gpu-rack-0")[1:])
    assert drained_events(plane) == []


def test_the_guard_per_domain_holds_a_second_rack_with_one_alert() -> None:
    plane = Plane(ON).up(RACKS)
    for rack in ("gpu-rack-0", "gpu-rack-1"):
        for node_id in rack_of(plane, rack)[:2]:
            plane.report(node_id, xid(79, plane.clock.now()))
            plane.report(node_id, xid(79, plane.clock.now()))
        plane.deliver()
    events = drained_events(plane)
    assert [(e.domain, e.held) for e in events] == [("gpu-rack-0", False), ("gpu-rack-1", True)]
    assert all(plane.node(n).state is not NodeState.IDLE for n in rack_of(plane, "gpu-rack-0"))
    # the held rack's other nodes stay in service
    assert [plane.node(n).state for n in rack_of(plane, "gpu-rack-1")[2:]] == [NodeState.IDLE] * 2


def test_without_the_setting_a_rack_failure_is_repaired_node_by_node() -> None:
    off = replace(ON, repair=RepairConfig())
    plane = Plane(off).up(RACKS)
    for node_id in rack_of(plane, "gpu-rack-0"):
        plane.report(node_id, xid(79, plane.clock.now()))
    plane.deliver()
    assert drained_events(plane) == []
    states = [plane.node(n).state for n in rack_of(plane, "gpu-rack-0")]
    assert states.count(NodeState.SUSPECT) == 1  # 12 nodes, 25%: 3 out, the 4th held


def test_a_drained_rack_is_one_alert_from_state() -> None:
    plane = Plane(ON).up(RACKS)
    for node_id in rack_of(plane, "gpu-rack-0"):
        plane.report(node_id, xid(79, plane.clock.now()))
    plane.deliver()
    with plane.uow() as uow:
        found = alerts.domain_alerts(uow.partitions.list("c1"))
    assert [(a.kind, a.subject) for a in found] == [("rack_drained", "c1/gpu-rack-0")]
    assert alerts.node_alerts(plane.nodes("c1"), plane.clock.now()) == []  # none per node


def test_a_redelivered_diagnosis_neither_drains_nor_alerts_again() -> None:
    plane = Plane(ON).up(RACKS)
    for node_id in rack_of(plane, "gpu-rack-0")[:2]:
        plane.report(node_id, xid(79, plane.clock.now()))
    plane.deliver()
    diagnoses = [env.event for env in plane.delivered if isinstance(env.event, NodeDiagnosed)]
    assert len(drained_events(plane)) == 1 and diagnoses
    for event in diagnoses:  # the same diagnoses again, as new deliveries (a redelivery)
        plane.inject(event)
    plane.deliver()
    assert len(drained_events(plane)) == 1
    with plane.uow() as uow:
        partition = uow.partitions.get("c1", "train")
    assert partition is not None and list(partition.drained_domains) == ["gpu-rack-0"]


def test_the_drained_rack_is_a_metric() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from services.observability import metrics

    plane = Plane(ON).up(RACKS)
    reg = metrics.registry(plane.store, plane.clock, event_log=plane.deps.event_log)

    def racks() -> dict[str, float]:
        families = text_string_to_metric_families(metrics.render(reg).decode())
        return {s.labels["state"]: s.value for f in families for s in f.samples
                if s.name == "mtc_racks_drained"}

    assert racks() == {"drained": 0, "held": 0}
    for node_id in rack_of(plane, "gpu-rack-0")[:2]:
        plane.report(node_id, xid(79, plane.clock.now()))
    plane.deliver()
    assert racks() == {"drained": 1, "held": 0}


def test_a_lost_node_is_replaced_by_the_spare_in_the_jobs_own_rack() -> None:
    """Spares per rack: r-b holds nodes 0-3, r-a nodes 4-7, each rack's last node a spare.
    The job packs into r-a (4, 5, 6); when 5 is lost, the resumed job takes r-a's spare (7),
    not the spare with the lower id in the other rack (3)."""
    places = [{"rack": "r-b"}] * 4 + [{"rack": "r-a"}] * 4
    body = {**RACKS, "nodePools": [{**RACKS["nodePools"][0], "nodeCount": 8, "spareCount": 2,
                                    "topology": {"nodes": places, "spareLayout": "perRack"}}]}
    plane = Plane(ON).up(body)
    assert sorted(n.node_id for n in plane.nodes("c1") if n.is_spare) == \
        ["c1-gpu-003", "c1-gpu-007"]
    placed = running_job(plane, 3)
    assert sorted(placed) == ["c1-gpu-004", "c1-gpu-005", "c1-gpu-006"]
    plane.clock.advance(5)
    plane.report("c1-gpu-005", xid(79, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2
    assert sorted(job.node_ids) == ["c1-gpu-004", "c1-gpu-006", "c1-gpu-007"]
