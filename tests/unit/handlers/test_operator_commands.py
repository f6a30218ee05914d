"""Defect 6: held nodes take no new work, and operators have commands (release a hold,
drain, resume, return a FAILED node) that mtc never undoes by itself."""

from __future__ import annotations

from typing import Any

import pytest

from services.job_submission import commands as job_commands
from services.repair import operator
from shared.domain import lifecycle
from shared.domain.errors import Conflict, NotFound, ValidationError
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.domain.model import JobState, NodeState
from tests.harness import CLUSTER, Plane, healthy, job_body, xid

NODES = ["c1-gpu-000", "c1-gpu-001", "c1-gpu-002", "c1-gpu-003"]
NO_SPARE = {**CLUSTER, "nodePools": [{**CLUSTER["nodePools"][0], "spareCount": 0}]}


def ready(cluster: dict[str, Any] = CLUSTER) -> Plane:
    return Plane().up(cluster)


def act(plane: Plane, verb: str, node_id: str, reason: Any = "maintenance",
        cluster_id: str = "c1") -> Any:
    node = plane.api(lambda u, d: operator.act(verb, cluster_id, node_id, reason, "alice", u, d))
    plane.deliver()
    return node


def healthy_reports(plane: Plane, *nodes: str, times: int = 2) -> None:
    for _ in range(times):
        plane.clock.advance(1)
        for n in nodes:
            plane.report(n, healthy(plane.clock.now()))
        plane.deliver()


def operator_events(plane: Plane) -> list[Any]:
    return [e.event for e in plane.delivered if e.type == "mtc.node.operator_acted.v1"]


def test_held_node_gets_no_new_work() -> None:
    plane = ready(NO_SPARE)  # 4 workers, no spare, 25%: one node may be out at a time
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(4), u, d, "j1"))
    plane.deliver()
    assert sorted(plane.job("j1").node_ids) == NODES
    plane.clock.advance(5)
    for n in NODES:
        plane.report(n, xid(79, plane.clock.now()))
    plane.deliver()
    states = {n: plane.node(n).state for n in NODES}
    out = [n for n, s in states.items() if s is NodeState.DRAINING]
    held = [n for n, s in states.items() if s is NodeState.SUSPECT]
    assert len(out) == 1 and len(held) == 3, states
    plane.exit_workers("j1", 1, 75)  # checkpointed on SIGTERM: requeued
    plane.finish_repairs()
    healthy_reports(plane, *out)  # the repaired node passes and returns
    assert plane.node(out[0]).state is NodeState.IDLE
    job = plane.job("j1")
    assert job.state is JobState.PENDING and job.attempt == 1, job  # waits: no held node
    assert not any(job.node_ids), job.node_ids
    for n in held:  # held in service, as the guard decided, but with no job
        node = plane.node(n)
        assert node.state is NodeState.SUSPECT and node.job_id is None and node.fault
    assert all(w.attempt == 1 for w in plane.compute.started)
    for n in held:  # an operator releases the holds (the window is past): repairs run
        plane.clock.advance(3600)
        act(plane, operator.RELEASE_HOLD, n, "shared cause ruled out")
        plane.finish_repairs()
        healthy_reports(plane, n)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2, job
    assert sorted(job.node_ids) == NODES
    assert all(plane.node(n).fault == "" for n in NODES)


def test_operator_release_hold() -> None:
    plane = ready()
    plane.report("c1-gpu-000", xid(79, plane.clock.now()))
    plane.report("c1-gpu-001", xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node("c1-gpu-001").state is NodeState.SUSPECT
    with pytest.raises(Conflict, match="not held"):
        act(plane, operator.RELEASE_HOLD, "c1-gpu-002")
    node = act(plane, operator.RELEASE_HOLD, "c1-gpu-001", "the switch is fine")
    assert node.state is NodeState.REPAIRING
    assert ("c1-gpu-001", "reboot") in [(n, a.value) for n, a, _ in plane.compute.repairs]
    assert "c1-gpu-001" in plane.compute.cordoned
    again = act(plane, operator.RELEASE_HOLD, "c1-gpu-001", "the switch is fine")  # a retry
    assert again.state is NodeState.REPAIRING
    events = operator_events(plane)
    assert [(e.node_id, e.action, e.reason, e.by) for e in events] == [
        ("c1-gpu-001", "releaseHold", "the switch is fine", "alice")]


def test_failed_node_can_be_returned_by_an_operator() -> None:
    plane = ready()
    node = "c1-gpu-002"
    plane.report(node, xid(54, plane.clock.now()))  # needs a person
    plane.deliver()
    assert plane.node(node).state is NodeState.FAILED
    with pytest.raises(Conflict, match="not FAILED"):
        act(plane, operator.RETURN, "c1-gpu-001")
    assert act(plane, operator.RETURN, node, "fan replaced").state is NodeState.VERIFYING
    healthy_reports(plane, node)
    assert plane.node(node).state is NodeState.IDLE
    assert node not in plane.compute.cordoned
    # a second time, its checks fail: back to FAILED, not up the ladder
    plane.clock.advance(3700)  # (past the guard's removal window)
    plane.report(node, xid(54, plane.clock.now()))
    plane.deliver()
    assert plane.node(node).state is NodeState.FAILED
    act(plane, operator.RETURN, node, "second look")
    plane.clock.advance(1)
    plane.report(node, xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node(node).state is NodeState.FAILED
    assert "after an operator returned it" in plane.node(node).reason
    assert plane.compute.repairs == []


def test_operator_drain_is_never_undone_by_mtc() -> None:
    plane = ready()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    busy = plane.job("j1").node_ids[0]
    assert act(plane, operator.DRAIN, busy, "bad fan").state is NodeState.DRAINING
    assert plane.compute.signalled == [("j1", 1)]
    plane.exit_workers("j1", 1, 75)  # checkpoints and moves (to the spare)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and busy not in job.node_ids
    assert plane.node(busy).state is NodeState.DRAINED and plane.compute.repairs == []
    healthy_reports(plane, busy, times=4)  # agents' healthy reports (DrainedByOperator FALSE)
    plane.clock.advance(7200)
    plane.deliver()
    assert plane.node(busy).state is NodeState.DRAINED and plane.compute.repairs == []
    assert lifecycle.operator_drained(plane.node(busy))
    # an administrator's own Slurm drain: the same representation, the same outcome
    idle = next(n for n in NODES if plane.node(n).state is NodeState.IDLE)
    drain = Condition(ConditionType.DRAINED_BY_OPERATOR.value, ConditionStatus.TRUE,
                      "Slurm node x drained by an operator: maintenance", plane.clock.now())
    plane.report(idle, (drain.to_dict(),), source="operator")
    plane.deliver()
    assert plane.node(idle).state is NodeState.DRAINED
    plane.report(idle, (*healthy(plane.clock.now()), drain.to_dict()))
    plane.report(idle, healthy(plane.clock.now() + 1))
    plane.deliver()
    assert plane.node(idle).state is NodeState.DRAINED and plane.compute.repairs == []
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j2"))
    plane.deliver()
    assert idle not in plane.job("j2").node_ids and busy not in plane.job("j2").node_ids
    # lifting: `resume`, or the operator's Slurm drain lifted (FALSE from the operator)
    with pytest.raises(Conflict, match="not drained by an operator"):
        act(plane, operator.RESUME, "c1-gpu-003")
    assert act(plane, operator.RESUME, busy, "fan replaced").state is NodeState.IDLE
    lifted = Condition(ConditionType.DRAINED_BY_OPERATOR.value, ConditionStatus.FALSE,
                       "lifted", plane.clock.now())
    plane.report(idle, (lifted.to_dict(),), source="operator")
    plane.deliver()
    assert plane.node(idle).in_service  # back (and j2, waiting for it, took it)
    assert [(e.action, e.reason) for e in operator_events(plane)] == [
        ("drain", "bad fan"), ("resume", "fan replaced")]


def test_operator_commands_refuse_bad_input_and_change_nothing() -> None:
    plane = ready()
    plane.api(job_commands.create_cluster, {**CLUSTER, "clusterId": "c2",
                                   "nodePools": [{**CLUSTER["nodePools"][0], "spareCount": 0,
                                                  "nodeCount": 1}]})
    plane.deliver()
    before = plane.node("c1-gpu-000").to_dict()
    with pytest.raises(NotFound):
        act(plane, operator.DRAIN, "c1-gpu-999")
    with pytest.raises(NotFound):
        act(plane, operator.DRAIN, "c1-gpu-000", cluster_id="c2")
    for reason in ("", "   ", None, 5):
        with pytest.raises(ValidationError, match="reason"):
            act(plane, operator.DRAIN, "c1-gpu-000", reason)
    with pytest.raises(Conflict):
        act(plane, operator.DRAIN, "c1-login")
    assert plane.node("c1-gpu-000").to_dict() == before
    assert operator_events(plane) == []
