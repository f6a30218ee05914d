"""The progress watchdog: a running job that stops making progress is noticed (pure; time
is passed in).

An NCCL hang or a dead peer that did not exit leaves every process alive and every node
healthy: only the job's progress stops. Progress is what the control plane hears of the
job's steps: the attempt's start and each new checkpoint (``JobCheckpointSaved`` carries
the step; the Compute port reports nothing finer, and a node heartbeat proves the node
alive, not the job). On the periodic ``FleetTicked`` (job_submission's tick), a RUNNING job
whose last progress is older than its limit is interrupted through the usual path
(``JobInterruptRequested``: SIGTERM, the grace period, SIGKILL) with a reason starting
:data:`NO_PROGRESS`, and requeued when its workers exit; the goodput accounting tallies the
lost time under that cause.

The limit is ``max(progress_timeout_s, progress_interval_factor x the longest gap between
progress the job has shown)``, so a job that checkpoints hourly is not cut at 30 minutes.
A job that never reported progress (no checkpoint yet, in any attempt) is not watched: its
silence proves nothing. ``progress_timeout_s`` 0 turns the watchdog off.
"""

from __future__ import annotations

from shared.domain.model import Job, JobState

NO_PROGRESS = "no_progress"  # the cause (reason prefix) the goodput accounting tallies


def limit(job: Job, timeout_s: float, interval_factor: float) -> float | None:
    """The silence allowed to ``job``; None when it is not watched."""
    if timeout_s <= 0 or job.recovery.progress_interval_s <= 0:
        return None
    return max(timeout_s, interval_factor * job.recovery.progress_interval_s)


def stalled(job: Job, now: float, timeout_s: float, interval_factor: float) -> bool:
    """A running job, not already being stopped, silent for longer than its limit."""
    allowed = limit(job, timeout_s, interval_factor)
    last = job.recovery.progress_at
    return allowed is not None and last is not None and job.state is JobState.RUNNING \
        and job.interrupt_requested_at is None and now - last > allowed


def no_progress_reason(job: Job, now: float, timeout_s: float, interval_factor: float) -> str:
    allowed = limit(job, timeout_s, interval_factor) or 0.0
    silent = now - (job.recovery.progress_at or now)
    return f"{NO_PROGRESS}: no progress for {silent:.0f} s (limit {allowed:.0f} s)"


def started(job: Job, now: float) -> None:
    """A new attempt started: its progress is measured from now."""
    job.recovery.progress_at = now


def progressed(job: Job, attempt: int, at: float) -> None:
    """A checkpoint of ``attempt`` was saved at ``at``: progress, if of the running attempt."""
    rec = job.recovery
    if attempt != job.attempt or rec.progress_at is None or at <= rec.progress_at:
        return
    rec.progress_interval_s = max(rec.progress_interval_s, at - rec.progress_at)
    rec.progress_at = at
