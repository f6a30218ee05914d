"""A rank the platform could not start (the launcher's own set-up failed before exec: a
sandbox bind of a directory a repair had just wiped) is nobody's failure but the platform's:
the job restarts without its program read as failed, its nodes blamed, or its no-progress
streak grown. A command that exec itself refused is still the job's failure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from services.job_submission import commands as job_commands
from shared.config import ControlPlaneConfig
from shared.domain import exits
from shared.domain.events import JobRequeued, JobWorkersExited, NodeDiagnosed
from shared.domain.model import Job, JobState, NodeCondition
from shared.domain.recovery import JobRecovery
from shared.policies import restarts
from shared.policies.restarts import RestartConfig
from tests.harness import Plane, job_body

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12, progress_timeout_s=0)
WIPED = "rank 1 was not started: cannot start 'python': bind of /shm/n2/j1/peer: gone"


def submit(plane: Plane, restart_anyway: bool = False) -> Job:
    body = job_body(2)
    if restart_anyway:
        body["jobSpec"]["scheduling"] = {"restartJobOnWorkerRestart": True}
    plane.api(lambda u, d: job_commands.submit_job("c1", body, u, d, "j1"))
    plane.deliver()
    job: Job = plane.job("j1")
    assert job.state is JobState.RUNNING
    return job


def not_started(plane: Plane, attempt: int, code: int = 126, why: str = WIPED) -> None:
    plane.inject(JobWorkersExited(job_id="j1", attempt=attempt, exit_code=code,
                                  detail=f"exit code {code}", launch_failed=why))
    plane.deliver()


def suspected(plane: Plane) -> list[Any]:
    return [env.event.node_id for env in plane.delivered if isinstance(env.event, NodeDiagnosed)
            and env.event.failure_mode == restarts.SUSPECT_FAILURE_MODE]


def test_the_platform_failing_to_start_a_rank_restarts_the_job() -> None:
    plane = Plane(QUIET).up()
    submit(plane)
    not_started(plane, 1)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2 and not job.error
    requeued = [e.event for e in plane.delivered if isinstance(e.event, JobRequeued)]
    assert [exits.interrupt_cause(r.reason) for r in requeued] == [exits.LAUNCH_FAILED]
    assert "bind of /shm/n2/j1/peer" in requeued[0].reason


def test_a_command_that_cannot_run_is_still_the_jobs_failure() -> None:
    plane = Plane(QUIET).up()
    submit(plane)
    plane.exit_workers("j1", 1, 127)  # no launcher evidence: exec refused the command
    job = plane.job("j1")
    assert job.state is JobState.FAILED and "127" in job.error


def test_evidence_of_a_launch_failure_counts_only_with_a_never_started_code() -> None:
    plane = Plane(QUIET).up()
    submit(plane)
    not_started(plane, 1, code=1)  # the program ran and failed: the word is no excuse
    assert plane.job("j1").state is JobState.FAILED


def test_nodes_are_not_blamed_nor_the_streak_grown_by_launch_failures() -> None:
    """A node with a fault present is blamed for attempts that end while it is there: not
    for ones the platform could not start. Nor does the backoff count them as restarts
    without progress: the first restarts at once, the platform failing again backs off."""
    plane = Plane(replace(QUIET, restart=RestartConfig(backoff_base_s=10))).up()
    job = submit(plane, restart_anyway=True)
    node_id = job.node_ids[0]
    with plane.uow() as uow:  # a fault seen on it, not acted on (an XID 13 keeps the node)
        node = uow.nodes.get(node_id)
        assert node is not None
        node.conditions["XidError"] = NodeCondition("true", "Xid 13", plane.clock.now(),
                                                    plane.clock.now())
        uow.commit()
    streak = plane.job("j1").recovery.streak
    not_started(plane, 1)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2  # at once
    assert job.recovery.streak == streak and job.recovery.failed_on == []
    not_started(plane, 2)
    job = plane.job("j1")
    assert suspected(plane) == [] and node_id in job.node_ids
    assert job.state is JobState.PENDING  # the second in a row waits its backoff
    assert job.recovery.not_before == plane.clock.now() + 10
    assert job.recovery.streak == streak and job.recovery.launch_failures == 2


def test_the_same_exits_without_the_evidence_blame_the_node() -> None:
    """The control: exit 126 twice with the faulty node and no launcher evidence."""
    plane = Plane(replace(QUIET, restart=RestartConfig(backoff_base_s=0))).up()
    job = submit(plane, restart_anyway=True)
    node_id = job.node_ids[0]
    with plane.uow() as uow:
        node = uow.nodes.get(node_id)
        assert node is not None
        node.conditions["XidError"] = NodeCondition("true", "Xid 13", plane.clock.now(),
                                                    plane.clock.now())
        uow.commit()
    plane.exit_workers("j1", 1, 126)
    plane.exit_workers("j1", 2, 126)
    assert suspected(plane) == [node_id]


def test_a_held_early_exit_keeps_its_launch_evidence() -> None:
    rec = JobRecovery()
    rec.hold_early_exit(3, 126, "d", "", WIPED)
    again = JobRecovery.from_dict(rec.to_dict()).take_early_exit("j1", 3)
    assert again is not None and again.launch_failed == WIPED
