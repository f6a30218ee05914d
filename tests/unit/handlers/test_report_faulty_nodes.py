"""An operator reports nodes faulty (``reportFaultyNodes``): a deleted node comes back under
its own name, a reported host goes REPAIRING and returns, and a batch goes node by node
through the jobs' recovery policy and the blast-radius guard."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from services.job_submission import commands as job_commands
from services.repair import faulty, operator
from shared.config import ControlPlaneConfig
from shared.domain.errors import NotFound
from shared.domain.events import JobCheckpointSaved
from shared.domain.health import RepairAction
from shared.domain.model import NodeState
from tests.harness import CLUSTER, Plane, healthy, job_body

EIGHT = {**CLUSTER, "nodePools": [{**CLUSTER["nodePools"][0], "nodeCount": 8,
                                   "spareCount": 1}]}
QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)  # no heartbeat loss on advances
HOST = (faulty.FaultReason("PERFORMANCE", "slow allreduce"),)


def report(plane: Plane, *actions: faulty.NodeAction) -> Any:
    nodes = plane.api(lambda u, d: faulty.report(actions, "c1", "alice", u, d))
    plane.deliver()
    return nodes


def checkpointed(plane: Plane, job_id: str) -> None:
    """The job saved to every tier: its recovery policy has costs to weigh."""
    for step, tier, save_s in ((100, "durable", 30.0), (190, "peer", 2.0),
                               (195, "memory", 0.2)):
        plane.inject(JobCheckpointSaved(job_id=job_id, attempt=1, step=step,
                                        path=f"fake://{job_id}/{tier}-{step}",
                                        saved_at=plane.clock.now(), save_s=save_s, tier=tier))
        plane.clock.advance(5)
    plane.deliver()


def back_in_service(plane: Plane, *nodes: str) -> None:
    plane.finish_repairs()
    plane.compute.complete_deep_checks()
    plane.deliver()
    for _ in range(plane.deps.config.repair.return_after_passes + 1):
        plane.clock.advance(1)
        for n in nodes:
            plane.report(n, healthy(plane.clock.now()))
        plane.deliver()


def test_a_deleted_static_node_is_recreated_under_its_own_name() -> None:
    plane = Plane().up()
    report(plane, faulty.NodeAction("c1-gpu-001"))
    node = plane.node("c1-gpu-001")
    assert node.state is NodeState.REPAIRING and node.repair_action is RepairAction.REIMAGE
    assert ("c1-gpu-001", RepairAction.REIMAGE, 1) in plane.compute.repairs
    back_in_service(plane, "c1-gpu-001")
    assert plane.node("c1-gpu-001").state is NodeState.IDLE
    assert "c1-gpu-001-r1" not in {n.node_id for n in plane.nodes("c1")}


def test_a_reported_host_keeps_the_node_and_its_name() -> None:
    plane = Plane().up()
    report(plane, faulty.NodeAction("c1-gpu-002", HOST))
    node = plane.node("c1-gpu-002")
    assert node.state is NodeState.REPAIRING and node.repair_action is RepairAction.REPLACE
    assert ("c1-gpu-002", RepairAction.REPLACE, 1) in plane.compute.repairs
    assert "PERFORMANCE: slow allreduce" in node.reason and "c1-gpu-002" in plane.compute.cordoned
    back_in_service(plane, "c1-gpu-002")
    assert plane.node("c1-gpu-002").state is NodeState.IDLE
    acted = [e.event for e in plane.delivered if e.type == "mtc.node.operator_acted.v1"]
    assert [(e.action, e.by) for e in acted] == [("reportFaultyHost", "alice")]
    report(plane, faulty.NodeAction("c1-gpu-002", HOST))  # a retry: nothing more
    assert plane.node("c1-gpu-002").state is NodeState.IDLE


def test_a_batch_goes_through_the_guard_and_the_jobs_recovery() -> None:
    plane = Plane(QUIET).up(EIGHT)  # 9 nodes, 25%: two may be out at a time
    for job_id in ("j1", "j2"):
        plane.api(lambda u, d, j=job_id: job_commands.submit_job("c1", job_body(2), u, d, j))
    plane.deliver()
    for job_id in ("j1", "j2"):
        checkpointed(plane, job_id)
    n1, n2 = plane.job("j1").node_ids[0], plane.job("j2").node_ids[0]
    idle = next(n.node_id for n in plane.nodes("c1")
                if n.state is NodeState.IDLE and n.role.value == "worker" and not n.is_spare)
    report(plane, faulty.NodeAction(n1, HOST), faulty.NodeAction(n2),
           faulty.NodeAction(idle, HOST))
    states = {n: plane.node(n).state for n in (n1, n2, idle)}
    assert states == {n1: NodeState.DRAINING, n2: NodeState.DRAINING,
                      idle: NodeState.SUSPECT}, states
    for job_id in ("j1", "j2"):
        plane.exit_workers(job_id, 1, 75)  # checkpointed on SIGTERM
    chosen = {e.event.job_id: e.event.mode for e in plane.delivered
              if e.type == "mtc.job.recovery_chosen.v1"}
    assert chosen == {"j1": "hot_swap", "j2": "hot_swap"}, chosen  # a spare, or idle node
    for job_id in ("j1", "j2"):
        assert plane.job(job_id).recovery.decisions[-1]["mode"] == chosen[job_id]
    for job_id, out in (("j1", n1), ("j2", n2)):
        job = plane.job(job_id)
        assert job.attempt == 2 and out not in job.node_ids, (job_id, job)
    assert plane.node(idle).state is NodeState.SUSPECT  # held: a person releases it
    back_in_service(plane, n1, n2)
    plane.api(lambda u, d: operator.act(operator.RELEASE_HOLD, "c1", idle, "two are back",
                                        "alice", u, d))
    plane.deliver()
    assert plane.node(idle).state is NodeState.REPAIRING  # its host, under its own name
    assert (idle, RepairAction.REPLACE, 1) in plane.compute.repairs


def test_an_unknown_node_changes_nothing() -> None:
    plane = Plane().up()
    with pytest.raises(NotFound):
        report(plane, faulty.NodeAction("c1-gpu-000"), faulty.NodeAction("c1-gpu-999"))
    assert plane.node("c1-gpu-000").state is NodeState.IDLE
