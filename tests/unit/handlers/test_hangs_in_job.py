"""A hang with its culprit, on the in-memory plane: the adapter's HangInJob on the culprit's
node is triaged into the job's restart (in place: the node checks healthy), and a hang again
on another node fails the job as the program's fault, its nodes not taken out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from services.job_submission import commands as job_commands
from shared.config import ControlPlaneConfig
from shared.domain.events import JobInterruptRequested, NodeDiagnosed
from shared.domain.health import JOB_PROGRESS_SOURCE
from shared.domain.model import Job, JobState, NodeState
from shared.policies.hangs import HANG_IN_JOB, PROGRAM_HANG
from tests.harness import Plane, job_body

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)


def hang(node_id: str, at: float, culprit: int = 1) -> tuple[dict[str, Any], ...]:
    return ({"type": "HangInJob", "status": "true", "since": at,
             "reason": f"rank {culprit} did not enter all_reduce #12 that 3 rank(s) wait in",
             "details": {"job_id": "j1", "culprit": culprit, "silent_s": 4.2,
                         "threshold_s": 3.0}},)


def submit(plane: Plane) -> Job:
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    job: Job = plane.job("j1")
    assert job.state is JobState.RUNNING
    return job


def test_a_hang_restarts_the_job_in_place_then_again_elsewhere_is_the_programs() -> None:
    plane = Plane(QUIET).up()
    job = submit(plane)
    culprit = job.node_ids[1]
    plane.report(culprit, hang(culprit, plane.clock.now()), source=JOB_PROGRESS_SOURCE)
    plane.deliver()
    diagnosed = [e.event for e in plane.delivered if isinstance(e.event, NodeDiagnosed)]
    assert [(d.node_id, d.failure_mode, d.action) for d in diagnosed] == \
        [(culprit, HANG_IN_JOB, "restart_job")]
    asked = [e.event for e in plane.delivered if isinstance(e.event, JobInterruptRequested)]
    assert [(a.node_id, a.reason.split(":")[0]) for a in asked] == [(culprit, HANG_IN_JOB)]
    plane.exit_workers("j1", 1, 137)  # the stopped rank never saved: SIGKILL after the grace
    again = plane.job("j1")
    assert again.state is JobState.RUNNING and again.attempt == 2
    assert tuple(again.node_ids) == tuple(job.node_ids)  # the node checks healthy: in place
    assert again.recovery.hung_on == [culprit]
    assert plane.node(culprit).state is NodeState.ALLOCATED

    other = job.node_ids[0]  # the next hang's culprit runs on another node
    plane.clock.advance(60)
    plane.report(other, hang(other, plane.clock.now(), culprit=0), source=JOB_PROGRESS_SOURCE)
    plane.deliver()
    plane.exit_workers("j1", 2, 137)
    failed = plane.job("j1")
    assert failed.state is JobState.FAILED
    assert failed.error.startswith(PROGRAM_HANG) and culprit in failed.error and other in failed.error
    assert all(n.state is NodeState.IDLE for n in plane.nodes("c1") if n.node_id in job.node_ids)


def test_a_hang_on_a_node_that_turns_out_faulty_is_not_the_programs() -> None:
    """A lost or broken node stops its ranks as a hang does: the second hang, on a node then
    diagnosed with an XID 79, is the hardware's, so the job restarts off that node instead of
    failing as the program's fault (the twin found a node loss failing jobs that way)."""
    from tests.harness import xid

    plane = Plane(QUIET).up()
    job = submit(plane)
    first, second = job.node_ids[1], job.node_ids[0]
    plane.report(first, hang(first, plane.clock.now()), source=JOB_PROGRESS_SOURCE)
    plane.deliver()
    plane.exit_workers("j1", 1, 137)
    assert plane.job("j1").attempt == 2
    plane.clock.advance(60)
    plane.report(second, hang(second, plane.clock.now(), culprit=0), source=JOB_PROGRESS_SOURCE)
    plane.deliver()
    assert plane.job("j1").interrupt_reason.startswith(PROGRAM_HANG)  # so it looks, for now
    plane.report(second, xid(79, plane.clock.now()))  # the node's own evidence arrives
    plane.deliver()
    plane.exit_workers("j1", 2, 137)
    again = plane.job("j1")
    assert again.state in (JobState.RUNNING, JobState.PENDING), (again.state, again.error)
    assert second not in again.recovery.hung_on
    assert plane.node(second).state is not NodeState.ALLOCATED or second not in again.node_ids
