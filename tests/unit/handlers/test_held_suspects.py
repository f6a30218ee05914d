"""Suspects and held repairs are not lost: the three control-plane bugs the twin's one-node
zero-delay runs found, each on the in-memory plane with the real handlers.

- job_submission: a job kept its repeat-offender suspect out of every placement, even after
  the suspect was repaired and returned; a job that needs every node then waited for ever.
- repair: a held node diagnosed again with a lesser action (a restart-only XID) planned the
  lesser one and dropped the repair it owed.
- health_triage: a held node released by a healthy report woke no job waiting for a node.
"""

from __future__ import annotations

from dataclasses import replace

from services.job_submission import commands as job_commands
from services.job_submission import scheduling
from shared.config import ControlPlaneConfig
from shared.domain.events import JobInterruptRequested, NodeDiagnosed, NodeReturnedToService
from shared.domain.health import RepairAction
from shared.domain.model import JobState, NodeRole, NodeState
from shared.policies.repair import RepairConfig
from shared.policies.restarts import SUSPECT_FAILURE_MODE, RestartConfig
from tests.harness import CLUSTER, Plane, healthy, job_body, xid

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12,
                restart=RestartConfig(backoff_base_s=0))


NO_SPARES = {**CLUSTER, "nodePools": [{**CLUSTER["nodePools"][0], "spareCount": 0}]}


def plane_with(config: ControlPlaneConfig = QUIET) -> Plane:
    return Plane(config).up(NO_SPARES)


def workers(plane: Plane) -> list[str]:
    return [n.node_id for n in plane.nodes("c1") if n.role is NodeRole.WORKER]


def whole_fleet_job(plane: Plane) -> list[str]:
    """A job on every worker node (no spares): a suspect leaves it nowhere else to go."""
    count = len(workers(plane))
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(count), u, d, "j1"))
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and len(job.node_ids) == count
    return list(job.node_ids)


def suspect(plane: Plane, bad: str) -> None:
    """XID 13 (restart the job only) ends two attempts on ``bad``: it is suspected."""
    for attempt in (1, 2):
        plane.clock.advance(5)
        plane.report(bad, xid(13, plane.clock.now()))
        plane.deliver()
        plane.exit_workers("j1", attempt, 75)
    diagnosed = [env.event for env in plane.delivered if isinstance(env.event, NodeDiagnosed)]
    assert any(e.failure_mode == SUSPECT_FAILURE_MODE and e.node_id == bad for e in diagnosed)


def test_a_repaired_suspect_may_take_the_job_again() -> None:
    plane = plane_with()
    bad = whole_fleet_job(plane)[0]
    suspect(plane, bad)
    job = plane.job("j1")
    assert job.state is JobState.PENDING and bad in job.recovery.excluded_node_ids
    plane.finish_repairs(ok=True)  # the suspect's reboot worked
    for _ in range(plane.deps.config.repair.return_after_passes):
        plane.clock.advance(1)
        plane.report(bad, healthy(plane.clock.now()))
        plane.deliver()
    assert plane.node(bad).state is NodeState.ALLOCATED
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and bad in job.node_ids
    assert job.recovery.excluded_node_ids == []


def test_a_suspect_still_in_repair_stays_excluded() -> None:
    plane = plane_with()
    bad = whole_fleet_job(plane)[0]
    suspect(plane, bad)
    assert plane.node(bad).state in (NodeState.REPAIRING, NodeState.DRAINED)
    plane.clock.advance(60)
    plane.api(lambda u, d: scheduling.schedule("c1", u, d))  # a placement pass finds no node
    job = plane.job("j1")
    assert job.state is JobState.PENDING and bad in job.recovery.excluded_node_ids


HOLD_ALL = replace(QUIET, repair=RepairConfig(max_out_of_service_fraction=0.0,
                                              min_out_of_service_allowed=0))


def test_a_held_repair_is_kept_when_a_lesser_diagnosis_follows() -> None:
    """With the guard holding everything, an XID 79 (reboot) is held; the node's next
    diagnosis is a restart-only XID 13. Before the fix repair planned the restart (an
    interrupt of the job) and forgot the reboot; now the reboot stays owed, still held."""
    plane = plane_with(HOLD_ALL)
    node_id = whole_fleet_job(plane)[0]
    plane.report(node_id, xid(79, plane.clock.now()))
    plane.deliver()
    node = plane.node(node_id)
    assert node.state is NodeState.SUSPECT and node.repair_action is RepairAction.REBOOT
    interrupts = len([e for e in plane.delivered if isinstance(e.event, JobInterruptRequested)])
    plane.clock.advance(plane.deps.config.alert_reminder_s + 1)
    plane.report(node_id, xid(13, plane.clock.now()))
    plane.deliver()
    node = plane.node(node_id)
    assert node.state is NodeState.SUSPECT and node.repair_action is RepairAction.REBOOT
    assert len([e for e in plane.delivered
                if isinstance(e.event, JobInterruptRequested)]) == interrupts


def test_a_released_hold_wakes_a_waiting_job() -> None:
    """A held, idle node that reports healthy is released and announced, so a job waiting
    for a node starts on it without waiting for the next fleet tick."""
    plane = plane_with(HOLD_ALL)
    free = workers(plane)
    plane.report(free[0], xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node(free[0]).state is NodeState.SUSPECT
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(len(free)), u, d, "j1"))
    plane.deliver()
    assert plane.job("j1").state is JobState.PENDING
    plane.clock.advance(5)
    plane.report(free[0], healthy(plane.clock.now()))
    plane.deliver()
    returned = [e.event.node_id for e in plane.delivered
                if isinstance(e.event, NodeReturnedToService)]
    assert returned[-1] == free[0]
    assert plane.job("j1").state is JobState.RUNNING
