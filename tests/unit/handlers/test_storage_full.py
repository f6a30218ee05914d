"""A full disk interrupts a job, it does not fail it (the job side).

Handler tests on the in-memory plane: the compute adapter's exit carries the evidence
(``JobWorkersExited.storage_full``: the launcher read the file system at the rank's exit),
checkpoint_resume requeues the job instead of failing it, scheduling holds it PENDING while
the adapter's ``storage_space`` says the disk is still full (every tick re-reads it, the
restart budget untouched), an alert fires meanwhile, and the job resumes from its newest
checkpoint once there is room. Without the evidence the same exit stays the program's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from services.job_submission import commands as job_commands
from shared.config import ControlPlaneConfig
from shared.domain.events import (
    AlertRaised,
    FleetTicked,
    JobCheckpointSaved,
    JobRequeued,
    JobStarted,
    JobWorkersExited,
)
from shared.domain.model import Job, JobState
from shared.domain.recovery import JobRecovery
from shared.domain.storage import MIB
from tests.harness import FakeCompute, Plane, job_body

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)
PATH = "/out/j1/checkpoints"


@dataclass
class DiskCompute(FakeCompute):
    """The fake machines, with the ``StorageSpace`` capability over one file system."""

    free: int = 0
    total: int = 8 * MIB
    asked: list[str] = field(default_factory=list)

    def storage_space(self, path: str) -> tuple[int, int] | None:
        self.asked.append(path)
        return self.free, self.total


def plane_on_a_disk() -> tuple[Plane, DiskCompute]:
    plane = Plane(QUIET)
    disk = DiskCompute()
    plane.compute = disk
    plane.deps = replace(plane.deps, compute=disk)
    plane.up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    plane.inject(JobCheckpointSaved(job_id="j1", attempt=1, step=10, path=f"{PATH}/ckpt-10",
                                    saved_at=plane.clock.now()))
    plane.deliver()
    return plane, disk


def tick(plane: Plane) -> None:
    plane.clock.advance(5.0)
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()


def events(plane: Plane, cls: type) -> list:  # type: ignore[type-arg]
    return [env.event for env in plane.delivered if isinstance(env.event, cls)]


def test_a_full_disk_interrupts_the_job_which_waits_and_resumes_from_its_checkpoint() -> None:
    plane, disk = plane_on_a_disk()
    plane.inject(JobWorkersExited(job_id="j1", attempt=1, exit_code=1,
                                  detail="exit codes rank 0: 1, rank 1: 143",
                                  storage_full=PATH))
    plane.deliver()
    job: Job = plane.job("j1")
    assert job.state is JobState.PENDING, job.error  # interrupted, not FAILED
    assert job.recovery.storage_full == PATH and job.restart_count == 1
    requeued = events(plane, JobRequeued)
    assert requeued and requeued[-1].reason.startswith(f"storage_full: disk full at {PATH}")
    for _ in range(5):  # the disk stays full: every tick looks again, nothing starts
        tick(plane)
    job = plane.job("j1")
    assert job.state is JobState.PENDING and job.attempt == 1 and job.restart_count == 1
    assert len(plane.compute.gangs) == 1 and disk.asked.count(PATH) >= 5
    firing = [a for a in events(plane, AlertRaised) if a.kind == "job_storage_full"]
    assert [a.state for a in firing] == ["firing"] and PATH in firing[0].summary
    disk.free = disk.total // 2  # room again
    tick(plane)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2 and job.restart_count == 1
    assert not job.recovery.storage_full
    started = [e for e in events(plane, JobStarted) if e.attempt == 2]
    assert started and started[0].resume_step == 10  # from its newest checkpoint
    alerts = [a.state for a in events(plane, AlertRaised) if a.kind == "job_storage_full"]
    assert alerts == ["firing", "resolved"]
    plane.exit_workers("j1", 2, 0)
    assert plane.job("j1").state is JobState.SUCCEEDED


def test_without_the_evidence_the_same_exit_is_the_programs_failure() -> None:
    plane, disk = plane_on_a_disk()
    plane.inject(JobWorkersExited(job_id="j1", attempt=1, exit_code=1,
                                  detail="OSError: [Errno 28] No space left on device"))
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.FAILED and "program's own failure" in job.error
    assert not disk.asked


def test_a_clean_exit_or_a_preemption_ignores_the_evidence() -> None:
    """Evidence explains a failure: exit 0 still succeeds, 75 still restarts at once."""
    plane, _ = plane_on_a_disk()
    plane.inject(JobWorkersExited(job_id="j1", attempt=1, exit_code=75, storage_full=PATH))
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2 and not job.recovery.storage_full
    plane.inject(JobWorkersExited(job_id="j1", attempt=2, exit_code=0, storage_full=PATH))
    plane.deliver()
    assert plane.job("j1").state is JobState.SUCCEEDED


def test_an_exit_held_before_its_start_keeps_its_evidence() -> None:
    rec = JobRecovery()
    rec.hold_early_exit(3, 1, "exit codes rank 0: 1", PATH)
    again = JobRecovery.from_dict(rec.to_dict())
    event = again.take_early_exit("j1", 3)
    assert event is not None and event.storage_full == PATH


def test_defect_3_a_job_that_fills_its_disk_twice_fails_as_its_own_failure() -> None:
    """One job filled the disk, was requeued when the file was deleted, resumed and filled
    it again, forever: the second full disk of the same job is the program's failure."""
    plane, disk = plane_on_a_disk()
    plane.inject(JobWorkersExited(job_id="j1", attempt=1, exit_code=1, storage_full=PATH))
    plane.deliver()
    assert plane.job("j1").state is JobState.PENDING
    disk.free = disk.total // 2
    tick(plane)
    assert plane.job("j1").state is JobState.RUNNING and plane.job("j1").attempt == 2
    plane.inject(JobWorkersExited(job_id="j1", attempt=2, exit_code=1,
                                  detail="exit codes rank 0: 1", storage_full=PATH))
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.FAILED and "full again" in job.error and PATH in job.error
    assert job.recovery.storage_full_times == 1
    assert JobRecovery.from_dict(job.recovery.to_dict()).storage_full_times == 1
