"""Restores that cannot loop, through the real handlers on the in-memory plane.

A program that crashes on every restore climbs the ladder (in place from memory, then a
restart that skips memory, then requeues from durable) and the job fails with the evidence
after a bounded number of attempts; what each attempt restored, and which tier failed its
check and why, is on the job and in its timeline."""

from __future__ import annotations

from dataclasses import replace

from mtc_program.protocol import RESTORE_SKIP
from services.console import jobpage
from services.job_submission import commands as job_commands
from services.presentation import timeline
from shared.adapters.outbox import envelope_to_doc
from shared.config import ControlPlaneConfig
from shared.domain.events import (
    FleetTicked,
    JobCheckpointSaved,
    JobRecoveryChosen,
    JobRestored,
)
from shared.domain.model import Job, JobState
from tests.harness import Plane, job_body

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)  # no heartbeat loss on advances
CRASH = 1  # the program's own failure, restarted because the spec says so


def submit(plane: Plane) -> Job:
    body = job_body(2)
    body["jobSpec"]["scheduling"] = {"restartJobOnWorkerRestart": True}
    plane.api(lambda u, d: job_commands.submit_job("c1", body, u, d, "j1"))
    plane.deliver()
    job: Job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 1
    return job


def saved(plane: Plane, step: int, tier: str) -> None:
    plane.inject(JobCheckpointSaved(job_id="j1", attempt=1, step=step,
                                    path=f"fake://j1/{tier}-{step}", saved_at=plane.clock.now(),
                                    save_s=0.2, tier=tier))
    plane.deliver()
    plane.clock.advance(5)


def restored(plane: Plane, attempt: int, step: int, tier: str, skipped: tuple[str, ...] = (),
             failed: tuple[str, ...] = ()) -> None:
    plane.inject(JobRestored(job_id="j1", attempt=attempt, step=step, tiers=(tier,),
                             failed=failed, skipped=skipped))
    plane.deliver()


def started(plane: Plane, attempt: int) -> Job:
    """The attempt runs: a requeued job starts once its backoff is over."""
    job: Job = plane.job("j1")
    if job.state is JobState.PENDING:
        assert job.recovery.not_before is not None
        plane.clock.advance(job.recovery.not_before - plane.clock.now() + 1)
        plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
        plane.deliver()
        job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == attempt
    return job


def skip_of(plane: Plane) -> str | None:
    gang = plane.compute.gangs[-1]
    return dict(gang.groups[0].env).get(RESTORE_SKIP)


def test_a_program_that_crashes_on_every_restore_escalates_then_fails_with_evidence() -> None:
    plane = Plane(QUIET).up()
    submit(plane)
    saved(plane, 100, "durable")
    saved(plane, 190, "peer")
    saved(plane, 195, "memory")
    plane.exit_workers("j1", 1, CRASH)  # attempt 1 made progress: in place, from memory
    assert plane.compute.gangs[-1].recovery is not None
    assert plane.compute.gangs[-1].recovery.mode == "in_place" and skip_of(plane) is None

    restored(plane, 2, 195, "memory")
    plane.exit_workers("j1", 2, CRASH)  # crashed on the restore: no more in place, no memory
    job = started(plane, 3)
    assert skip_of(plane) == "memory"
    last = [e.event for e in plane.delivered if isinstance(e.event, JobRecoveryChosen)][-1]
    assert last.mode != "in_place" and "escalated to peer" in last.reason
    assert "in_place" in last.reason and "skips memory" in last.reason

    restored(plane, 3, 190, "peer", skipped=("memory",))
    plane.exit_workers("j1", 3, CRASH)  # the peer copy too: requeue from durable only
    started(plane, 4)
    assert skip_of(plane) == "memory,peer"
    restored(plane, 4, 100, "durable", skipped=("memory", "peer"))
    plane.exit_workers("j1", 4, CRASH)
    started(plane, 5)
    assert skip_of(plane) == "memory,peer"
    restored(plane, 5, 100, "durable", skipped=("memory", "peer"))
    plane.exit_workers("j1", 5, CRASH)

    job = plane.job("j1")
    assert job.state is JobState.FAILED and job.attempt == 5  # bounded: no sixth attempt
    assert len(plane.compute.gangs) == 5
    assert "every rung of the ladder spent" in job.error
    for said in ("attempt 2 (in_place, restored step 195 from memory)",
                 "attempt 3 (requeue, memory skipped, restored step 190 from peer)",
                 "attempt 5 (requeue, memory and peer skipped, restored step 100 from durable)",
                 "exited with"):
        assert said in job.error, (said, job.error)


def test_progress_starts_the_ladder_again() -> None:
    plane = Plane(QUIET).up()
    submit(plane)
    saved(plane, 195, "memory")
    plane.exit_workers("j1", 1, CRASH)
    plane.exit_workers("j1", 2, CRASH)  # no progress: escalated, memory skipped
    started(plane, 3)
    assert skip_of(plane) == "memory"
    plane.inject(JobCheckpointSaved(job_id="j1", attempt=3, step=200, path="fake://j1/m-200",
                                    saved_at=plane.clock.now(), save_s=0.2, tier="memory"))
    plane.deliver()
    plane.exit_workers("j1", 3, CRASH)  # it trained: in place again, every tier readable
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 4
    assert job.recovery.stalled == [] and job.recovery.restore_skip == []
    assert plane.compute.gangs[-1].recovery is not None
    assert plane.compute.gangs[-1].recovery.mode == "in_place" and skip_of(plane) is None


def test_a_fallback_is_on_the_job_and_in_its_timeline_once() -> None:
    plane = Plane(QUIET).up()
    submit(plane)
    failed = ("rank 1: memory step 195: sha256 does not match its manifest",)
    for _ in range(2):  # redelivered: recorded once
        restored(plane, 1, 195, "peer", failed=failed)
    job = plane.job("j1")
    assert job.recovery.restores == [{"attempt": 1, "step": 195, "tiers": ["peer"],
                                      "failed": list(failed), "skipped": []}]
    docs = [envelope_to_doc(e) for e in plane.delivered]
    line = timeline.describe(next(d for d in docs if d["type"] == "mtc.job.restored.v1"))
    assert "attempt 1 restored step 195 from peer" in line
    assert "FELL BACK: rank 1: memory step 195: sha256 does not match" in line
    [row] = jobpage.attempts(docs, "j1")  # what `mtc job describe` shows per attempt
    assert "from peer" in row["restore"] and "memory step 195" in row["restore"]


def test_interruptions_without_progress_never_spend_the_ladder() -> None:
    """The twin's 60-day Llama 3 job failed on day 38: maintenance stops and a host fault
    during slow starts, each ending an attempt before it saved, spent the ladder. Only the
    program's own ends count on it; the platform's leave it where it was."""
    plane = Plane(QUIET).up()
    submit(plane)
    saved(plane, 195, "memory")
    for attempt in range(1, 8):  # stopped before any save, each time, by the platform
        plane.exit_workers("j1", attempt, 75)  # checkpointed on SIGTERM and left
        job = started(plane, attempt + 1)
        assert job.recovery.stalled == [] and skip_of(plane) is None
    plane.exit_workers("j1", 8, CRASH)  # then its own crash: the ladder's first rung
    job = plane.job("j1")
    assert job.state in (JobState.PENDING, JobState.RUNNING), job.error
    assert [s["attempt"] for s in job.recovery.stalled] == [8]
