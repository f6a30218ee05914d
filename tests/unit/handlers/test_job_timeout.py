"""``jobSpec.scheduling.timeout``: a job past its deadline is stopped gracefully and fails.

Handler tests on the in-memory plane (fake clock, fake compute), then one run on the
embedded default with real subprocess workers.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.job_submission import commands as job_commands
from shared.config import ControlPlaneConfig
from shared.domain import exits, timeouts
from shared.domain.events import (
    FleetTicked,
    JobInterruptRequested,
    JobSignalled,
    JobWorkersExited,
)
from shared.domain.model import Job, JobState, NodeState
from tests.harness import CLUSTER, Plane, job_body, xid

ROOT = Path(__file__).resolve().parents[3]


def timed_body(timeout: str = "30s", replicas: int = 2) -> dict[str, Any]:
    body = job_body(replicas)
    body["jobSpec"]["scheduling"] = {"timeout": timeout}
    return body


def ready_plane(cluster: dict[str, Any] = CLUSTER) -> Plane:
    # nodes that stop reporting are not the subject here: no heartbeat loss on long advances
    return Plane(replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)).up(cluster)


def running(plane: Plane, body: dict[str, Any], job_id: str = "j1") -> Job:
    plane.api(lambda u, d: job_commands.submit_job("c1", body, u, d, job_id))
    plane.deliver()
    job: Job = plane.job(job_id)
    assert job.state is JobState.RUNNING and job.started_at == plane.clock.now()
    return job


def tick(plane: Plane) -> None:
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()


def delivered(plane: Plane, cls: type[Any]) -> list[Any]:
    return [env.event for env in plane.delivered if isinstance(env.event, cls)]


def worker_nodes_idle(plane: Plane) -> bool:
    return all(n.state is NodeState.IDLE and n.job_id is None for n in plane.nodes("c1"))


def test_nothing_happens_before_the_deadline() -> None:
    plane = ready_plane()
    running(plane, timed_body("30s"))
    for _ in range(3):
        plane.clock.advance(9.9)  # 29.7 s after the start
        tick(plane)
    assert plane.compute.signalled == []
    assert delivered(plane, JobInterruptRequested) == []
    assert plane.job("j1").state is JobState.RUNNING


@pytest.mark.parametrize("code", [0, 143, 75, 137])
def test_past_the_deadline_it_is_signalled_once_and_fails(code: int) -> None:
    plane = ready_plane()
    job = running(plane, timed_body("30s"))
    nodes = list(job.node_ids)
    plane.clock.advance(30.5)
    tick(plane)
    assert plane.compute.signalled == [("j1", 1)]
    assert [e.reason for e in delivered(plane, JobSignalled)] == \
        ["Job exceeded its timeout of 30s"]
    assert plane.job("j1").state is JobState.RUNNING  # graceful: waiting for the workers

    plane.clock.advance(5)
    tick(plane)  # a second tick: no second request, no second SIGTERM
    assert len(delivered(plane, JobInterruptRequested)) == 1
    assert len(delivered(plane, JobSignalled)) == 1
    assert plane.compute.signalled == [("j1", 1)]

    plane.exit_workers("j1", 1, code)  # even 0 after the SIGTERM is no success
    job = plane.job("j1")
    assert job.state is JobState.FAILED
    assert "timeout" in job.error and "30s" in job.error
    assert job.restart_count == 0 and job.attempt == 1  # not requeued
    assert job.ended_at == plane.clock.now()
    assert worker_nodes_idle(plane)
    assert all(plane.node(n).job_id is None for n in nodes)

    tick(plane)  # after the end: nothing changes
    assert plane.job("j1").state is JobState.FAILED
    assert plane.compute.signalled == [("j1", 1)]


def test_a_redelivered_tick_changes_nothing() -> None:
    plane = ready_plane()
    running(plane, timed_body("30s"))
    plane.clock.advance(31)
    env = plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()
    plane.bus.inject(env)
    plane.deliver()
    assert plane.compute.signalled == [("j1", 1)]
    assert len(delivered(plane, JobSignalled)) == 1
    plane.exit_workers("j1", 1, 143)
    plane.bus.inject(env)
    plane.deliver()
    assert plane.job("j1").state is JobState.FAILED
    assert plane.compute.signalled == [("j1", 1)]


def test_a_job_that_finishes_in_time_succeeds() -> None:
    plane = ready_plane()
    running(plane, timed_body("30s"))
    plane.clock.advance(20)
    tick(plane)
    plane.exit_workers("j1", 1, 0)
    plane.clock.advance(60)
    tick(plane)
    job = plane.job("j1")
    assert job.state is JobState.SUCCEEDED and job.error == ""
    assert plane.compute.signalled == []
    assert worker_nodes_idle(plane)


def test_a_job_without_a_timeout_runs_on() -> None:
    plane = ready_plane()
    running(plane, job_body(2))
    plane.clock.advance(365 * 24 * 3600)
    tick(plane)
    assert plane.compute.signalled == []
    assert plane.job("j1").state is JobState.RUNNING


def no_spare_plane() -> Plane:
    cluster: dict[str, Any] = copy.deepcopy(CLUSTER)
    cluster["nodePools"][0].update(nodeCount=2, spareCount=0)
    return ready_plane(cluster)


def requeued_without_a_node(plane: Plane) -> tuple[str, str]:
    """A node of the running job fails; the job checkpoints, is requeued and waits (PENDING)
    for a replacement, holding its healthy node."""
    bad, good = plane.job("j1").node_ids
    plane.report(bad, xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.compute.signalled == [("j1", 1)]
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.PENDING and job.restart_count == 1
    assert job.node_ids == ("", good) and plane.node(good).job_id == "j1"
    return bad, good


def test_a_requeued_job_past_its_deadline_fails_without_a_signal() -> None:
    plane = no_spare_plane()
    started = running(plane, timed_body("30s")).started_at
    plane.clock.advance(10)
    bad, good = requeued_without_a_node(plane)
    plane.clock.advance(15)
    tick(plane)
    assert plane.job("j1").state is JobState.PENDING  # 25 s since the first start

    plane.clock.advance(6)  # 31 s of wall time since the first start, requeued time included
    tick(plane)
    job = plane.job("j1")
    assert job.started_at == started
    assert job.state is JobState.FAILED and "30s" in job.error
    assert plane.compute.signalled == [("j1", 1)]  # only the drain's SIGTERM, none for this
    assert plane.node(good).state is NodeState.IDLE and plane.node(good).job_id is None
    assert plane.node(bad).state is not NodeState.ALLOCATED


def test_an_attempt_interrupted_for_a_drain_that_ends_past_the_deadline_fails() -> None:
    """Already being stopped (a node drains) when the deadline passes: no second SIGTERM,
    and the exit fails the job instead of requeueing it."""
    plane = no_spare_plane()
    running(plane, timed_body("30s"))
    bad, _ = plane.job("j1").node_ids
    plane.clock.advance(25)
    plane.report(bad, xid(79, plane.clock.now()))
    plane.deliver()
    plane.clock.advance(10)
    tick(plane)
    assert plane.compute.signalled == [("j1", 1)]
    assert delivered(plane, JobInterruptRequested) == []
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.FAILED and "30s" in job.error and job.restart_count == 0


def test_timeout_policy_is_pure_and_starts_at_the_first_start() -> None:
    plane = ready_plane()
    job = running(plane, timed_body("1.5s"))
    start = job.started_at
    assert start is not None
    assert timeouts.deadline(job) == start + 1.5
    assert not timeouts.timed_out(job, start + 1.4)
    assert timeouts.timed_out(job, start + 1.5)
    assert timeouts.timeout_error(job) == "Job exceeded its timeout of 1.5s"
    job.started_at = None
    assert timeouts.deadline(job) is None and not timeouts.timed_out(job, start + 1e9)
    plain = running(plane, job_body(1), "j2")
    assert not timeouts.timed_out(plain, 1e18)


def test_exit_verdict_timed_out() -> None:
    def verdict(code: int, interrupted: bool, anyway: bool = False) -> exits.Verdict:
        return exits.exit_verdict(code, interrupted=interrupted, restart_anyway=anyway,
                                  restarts=0, max_restarts=5, timed_out=True)

    assert verdict(0, True) is exits.Verdict.TIMED_OUT
    assert verdict(75, True) is exits.Verdict.TIMED_OUT
    assert verdict(143, True) is exits.Verdict.TIMED_OUT
    assert verdict(143, False) is exits.Verdict.FAILED  # a SIGTERM nobody sent: its own
    assert verdict(1, False, anyway=True) is exits.Verdict.TIMED_OUT
    assert verdict(0, False) is exits.Verdict.SUCCEEDED  # finished before anyone stopped it
    assert verdict(1, False) is exits.Verdict.FAILED  # its own failure says more
    assert exits.exit_verdict(75, interrupted=True, restart_anyway=False, restarts=0,
                              max_restarts=5) is exits.Verdict.RESTART


# ---------------------------------------------------------------- embedded default


def embedded_job(timeout: str) -> dict[str, Any]:
    from services.cli.demo import job_spec

    body = job_spec(100_000)  # ~83 min at 0.05 s a step: only the timeout ends it
    body["jobSpec"]["scheduling"]["timeout"] = timeout
    assert Path(body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"][1]) == \
        ROOT / "examples" / "train.py"
    assert body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"][0] == \
        sys.executable
    return body


@pytest.mark.slow
def test_embedded_job_past_its_timeout_ends_failed(tmp_path: Path) -> None:
    """Real subprocess workers, the embedded default's own tick (``run``'s 5 s): the
    training program gets SIGTERM, checkpoints, exits 75, and the job fails."""
    from services.cli.demo import CLUSTER_SPEC, demo_compute_options
    from services.wiring.embedded import embedded

    app = embedded(tmp_path / "state", compute_options=demo_compute_options())
    try:
        with app.transaction() as uow:
            job_commands.create_cluster(CLUSTER_SPEC, uow, app.deps)

        def cluster_ready() -> bool:
            with app.uow() as uow:
                cluster = uow.clusters.get("demo")
                return cluster is not None and cluster.state.value == "READY"

        assert app.run(cluster_ready, timeout_s=20)
        with app.transaction() as uow:
            job_commands.submit_job("demo", embedded_job("3s"), uow, app.deps, "deadline-1")

        def job() -> Job:
            with app.uow() as uow:
                found = uow.jobs.get("deadline-1")
            assert found is not None
            return found

        assert app.run(lambda: job().terminal, timeout_s=20)
        done = job()
        assert done.state is JobState.FAILED, (done.state, done.error)
        assert done.error == "Job exceeded its timeout of 3s"
        assert done.restart_count == 0 and done.attempt == 1
        assert done.started_at is not None and done.ended_at is not None
        assert 3.0 <= done.ended_at - done.started_at < 20.0
        with app.uow() as uow:
            workers = [n for n in uow.nodes.list("demo") if n.role.value == "worker"]
        assert all(n.state is NodeState.IDLE and n.job_id is None for n in workers)
        assert app.deps.event_log is not None
        log = [d for d in app.deps.event_log.read() if d["data"].get("job_id") == "deadline-1"]
        types = [d["type"] for d in log]
        assert types.count(JobSignalled.TYPE) == 1  # SIGTERM once, through the interrupt
        exited = [d["data"]["exit_code"] for d in log if d["type"] == JobWorkersExited.TYPE]
        assert exited == [exits.PREEMPTED]  # the program checkpointed on SIGTERM: still FAILED
    finally:
        app.compute.kill_all()
        app.close()
