"""Crash loops, restart backoff, repeat-offender nodes and the progress watchdog.

Handler tests on the in-memory plane (fake clock, fake compute): checkpoint_resume decides
program failure against infrastructure interruption on evidence and backs restarts off;
job_submission's tick starts backed-off jobs when their time comes and runs the watchdog.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from services.job_submission import commands as job_commands
from shared.config import ControlPlaneConfig
from shared.domain import exits, progress
from shared.domain.events import (
    FleetTicked,
    JobCheckpointSaved,
    JobInterruptRequested,
    JobRequeued,
    JobSignalled,
    NodeDiagnosed,
)
from shared.domain.model import Job, JobState, NodeCondition, NodeState
from shared.policies import restarts
from shared.policies.restarts import RestartConfig
from simulator import goodput
from tests.harness import Plane, job_body, xid

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)  # no heartbeat loss on advances


def plane_with(config: ControlPlaneConfig = QUIET) -> Plane:
    return Plane(config).up()


def submit(plane: Plane, job_id: str = "j1") -> Job:
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, job_id))
    plane.deliver()
    job: Job = plane.job(job_id)
    assert job.state is JobState.RUNNING
    return job


def checkpoint(plane: Plane, attempt: int, step: int) -> None:
    """The compute adapter found a new checkpoint of the attempt (JobCheckpointSaved)."""
    plane.inject(JobCheckpointSaved(job_id="j1", attempt=attempt, step=step,
                                    path=f"fake://j1/ckpt-{step}", saved_at=plane.clock.now()))
    plane.deliver()


def tick(plane: Plane) -> None:
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()


def delivered(plane: Plane, cls: type[Any]) -> list[Any]:
    return [env.event for env in plane.delivered if isinstance(env.event, cls)]


# ---------------------------------------------------------------- crash loops


def test_crash_loop_fails_the_job() -> None:
    """Exit 139 (SIGSEGV) with no interrupt and healthy nodes is the program's failure: the
    job fails after one attempt instead of restarting 100 times on the same nodes."""
    plane = plane_with()
    submit(plane)
    plane.exit_workers("j1", 1, 139)
    job = plane.job("j1")
    assert job.state is JobState.FAILED and job.attempt == 1 and job.restart_count == 0
    assert "139" in job.error and "SIGSEGV" in job.error
    assert len({(w.job_id, w.attempt) for w in plane.compute.started}) == 1
    assert all(n.state is NodeState.IDLE for n in plane.nodes("c1"))


def test_crash_with_a_node_fault_restarts() -> None:
    """The same 139 while a node under the attempt reports a fault: the node's doing."""
    plane = plane_with(replace(QUIET, progress_timeout_s=0))
    job = submit(plane)
    with plane.uow() as uow:  # a fault the agent saw, not yet acted on (severity warning)
        node = uow.nodes.get(job.node_ids[0])
        assert node is not None
        node.conditions["XidError"] = NodeCondition("true", "Xid 13", plane.clock.now(),
                                                    plane.clock.now())
        uow.commit()
    plane.exit_workers("j1", 1, 139)
    assert plane.job("j1").state is JobState.RUNNING and plane.job("j1").attempt == 2


def test_restart_on_worker_restart_keeps_its_meaning() -> None:
    """``restartJobOnWorkerRestart``: a failed worker restarts the whole job (backed off)."""
    plane = plane_with()
    body = job_body(2)
    body["jobSpec"]["scheduling"] = {"restartJobOnWorkerRestart": True}
    plane.api(lambda u, d: job_commands.submit_job("c1", body, u, d, "j1"))
    plane.deliver()
    plane.exit_workers("j1", 1, 139)
    assert plane.job("j1").state is JobState.RUNNING and plane.job("j1").attempt == 2
    plane.exit_workers("j1", 2, 139)  # again without progress: the streak backs off
    job = plane.job("j1")
    assert job.state is JobState.PENDING and job.recovery.not_before == plane.clock.now() + 10


# ---------------------------------------------------------------- backoff


def test_infrastructure_interruptions_back_off() -> None:
    """Successive drains without progress: each restart waits longer, up to the cap, and
    the scheduler does not start the job before its time, however often it ticks."""
    config = replace(QUIET, restart=RestartConfig(backoff_base_s=10, backoff_factor=2,
                                                  backoff_cap_s=40))
    plane = plane_with(config)
    submit(plane)
    delays = []
    for attempt in range(1, 7):
        plane.inject(JobInterruptRequested(job_id="j1", attempt=attempt, node_id="",
                                           reason="planned_maintenance: drain"))
        plane.deliver()
        plane.exit_workers("j1", attempt, 137)  # SIGKILL after the grace: we asked
        job = plane.job("j1")
        if job.state is JobState.RUNNING:
            delays.append(0.0)
            continue
        assert job.state is JobState.PENDING and job.recovery.not_before is not None
        delay = job.recovery.not_before - plane.clock.now()
        delays.append(delay)
        plane.clock.advance(delay - 1)
        tick(plane)
        assert plane.job("j1").state is JobState.PENDING  # not early
        plane.clock.advance(1)
        tick(plane)
        assert plane.job("j1").state is JobState.RUNNING and plane.job("j1").attempt == attempt + 1
    assert delays == [0.0, 10.0, 20.0, 40.0, 40.0, 40.0]


def test_progress_resets_the_backoff() -> None:
    plane = plane_with()
    submit(plane)
    for attempt in (1, 2):
        plane.exit_workers("j1", attempt, 75)
    assert plane.job("j1").state is JobState.PENDING  # second in a row: 10 s
    plane.clock.advance(10)
    tick(plane)
    checkpoint(plane, 3, 100)
    plane.exit_workers("j1", 3, 75)  # this attempt saved a checkpoint: at once again
    assert plane.job("j1").state is JobState.RUNNING and plane.job("j1").attempt == 4


def test_backoff_delay_is_pure_and_capped() -> None:
    cfg = RestartConfig()
    assert [restarts.backoff_delay(n, cfg) for n in range(1, 9)] == \
        [0, 10, 20, 40, 80, 160, 320, 600]
    assert restarts.backoff_delay(10_000, cfg) == 600
    assert restarts.backoff_delay(5, RestartConfig(backoff_base_s=0)) == 0


# ---------------------------------------------------------------- repeat offenders


def test_repeat_offender_node_is_suspected() -> None:
    """A node whose fault only restarts the job (XID 13: restart_job, the node stays in
    service) keeps ending its attempts: after 2 of the last 3 it is suspected, kept out of
    the next placement, held and diagnosed for repair; the job goes on elsewhere."""
    plane = plane_with(replace(QUIET, restart=RestartConfig(backoff_base_s=0)))
    job = submit(plane)
    bad = job.node_ids[0]
    for attempt in (1, 2):
        plane.clock.advance(5)
        plane.report(bad, xid(13, plane.clock.now()))
        plane.deliver()
        assert plane.compute.signalled[-1] == ("j1", attempt)
        plane.exit_workers("j1", attempt, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 3
    assert bad not in job.node_ids and len(job.node_ids) == 2 and all(job.node_ids)
    suspected = [e for e in delivered(plane, NodeDiagnosed)
                 if e.failure_mode == restarts.SUSPECT_FAILURE_MODE]
    assert [e.node_id for e in suspected] == [bad]
    assert "j1" in suspected[0].reasons[0]
    node = plane.node(bad)
    assert node.job_id is None
    assert node.state in (NodeState.SUSPECT, NodeState.DRAINED, NodeState.REPAIRING)
    assert any(r.failure_mode == restarts.SUSPECT_FAILURE_MODE for r in node.history)


def test_a_node_is_not_suspected_for_one_failure() -> None:
    plane = plane_with(replace(QUIET, restart=RestartConfig(backoff_base_s=0)))
    job = submit(plane)
    plane.report(job.node_ids[0], xid(13, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    assert job.node_ids == plane.job("j1").node_ids
    assert not [e for e in delivered(plane, NodeDiagnosed)
                if e.failure_mode == restarts.SUSPECT_FAILURE_MODE]


# ---------------------------------------------------------------- progress watchdog


WATCHED = replace(QUIET, progress_timeout_s=600.0)


def test_hung_job_is_interrupted_and_requeued() -> None:
    """A checkpoint, then silence past the limit (an NCCL hang): one SIGTERM however many
    ticks, a requeue when the workers are killed, and the lost time under ``no_progress``."""
    plane = plane_with(WATCHED)
    submit(plane)
    plane.clock.advance(60)
    checkpoint(plane, 1, 100)
    plane.clock.advance(600)
    tick(plane)
    assert plane.compute.signalled == []  # exactly the limit: not yet
    plane.clock.advance(1)
    for _ in range(3):  # redelivered / repeated ticks
        tick(plane)
    assert plane.compute.signalled == [("j1", 1)]
    signals = delivered(plane, JobSignalled)
    assert len(signals) == 1 and signals[0].reason.startswith(progress.NO_PROGRESS)
    plane.clock.advance(30)
    plane.exit_workers("j1", 1, 137)  # hung: SIGKILL after the grace period
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2
    requeued = delivered(plane, JobRequeued)
    assert len(requeued) == 1 and exits.interrupt_cause(requeued[0].reason) == "no_progress"
    rows: list[dict[str, Any]] = [
        {"type": env.type, "time": env.time, "data": env.event.to_dict()}
        for env in plane.delivered]
    params = {"j1": goodput.JobParams(step_time_s=1.0, checkpoint_save_s=1.0,
                                      checkpoint_restore_s=1.0, startup_s=1.0, nodes=2)}
    acct = goodput.account(rows, params=params, start=plane.delivered[0].time,
                           end=plane.clock.now() + 60)
    assert acct.jobs["j1"].by_cause().get(progress.NO_PROGRESS, 0) > 0


def test_progress_resets_the_watchdog() -> None:
    plane = plane_with(WATCHED)
    submit(plane)
    for step in range(1, 8):  # a checkpoint every 500 s: 3,500 s of training, never silent
        plane.clock.advance(500)
        checkpoint(plane, 1, step * 100)
        tick(plane)
    assert plane.compute.signalled == [] and plane.job("j1").state is JobState.RUNNING


def test_the_limit_follows_a_slow_checkpoint_cadence() -> None:
    """A job that checkpoints every 1,000 s is allowed 3 x that, not the 600 s floor."""
    plane = plane_with(WATCHED)
    submit(plane)
    plane.clock.advance(1000)
    checkpoint(plane, 1, 100)
    plane.clock.advance(2999)
    tick(plane)
    assert plane.compute.signalled == []
    plane.clock.advance(2)
    tick(plane)
    assert plane.compute.signalled == [("j1", 1)]


def test_a_job_without_the_watchdog_is_untouched() -> None:
    """Off (0): nothing happens; on, a job that never reported progress is not watched."""
    off = plane_with(replace(QUIET, progress_timeout_s=0))
    submit(off)
    checkpoint(off, 1, 100)
    off.clock.advance(10 * 86_400)
    tick(off)
    silent = plane_with(WATCHED)
    submit(silent)
    silent.clock.advance(10 * 86_400)
    tick(silent)
    for plane in (off, silent):
        assert plane.compute.signalled == [] and plane.job("j1").state is JobState.RUNNING
        assert delivered(plane, JobInterruptRequested) == []
