"""``jobSpec.scheduling.timeout``: how long a job may run (pure; time is passed in).

Managed training's CustomJob timeout limits the job's run time; when it passes, the job is
stopped and ends ``JOB_STATE_FAILED`` with an error naming the deadline. mtc measures it so:

* **the clock starts at the job's first start** (``Job.started_at``, set by the first
  attempt and never moved): time queued or pending before that does not count;
* **it is wall time since that first start**: time spent requeued, waiting for a spare or
  restarting after an interruption counts too, so restarts cannot stretch the deadline;
* the deadline is enforced on the periodic ``FleetTicked`` (job_submission's tick), so a job
  is stopped within one tick period of its deadline (embedded: ``EmbeddedApp.run`` ticks
  every 5 s by default; GCP: Cloud Scheduler, every minute by default; the twin sends no ticks
  and its jobs have no timeout). A running job is stopped gracefully
  (``JobInterruptRequested`` with :func:`timeout_error` as its reason: SIGTERM, the grace
  period, then SIGKILL); a job between attempts (requeued, no workers running) is failed
  at once. When a stopped attempt's workers exit, whatever their exit code, the job fails
  with :func:`timeout_error` (``shared.domain.exits.Verdict.TIMED_OUT``); so does an attempt
  that ends past the deadline and would otherwise restart (e.g. one already being stopped
  for a drain). One that exits 0 on its own before it was stopped succeeds.

A job without a timeout never times out.
"""

from __future__ import annotations

from shared.domain.model import Job, JobState

# states in which the tick enforces the deadline (CANCELLING: the user's stop wins)
BETWEEN_ATTEMPTS = frozenset({JobState.QUEUED, JobState.PENDING})


def deadline(job: Job) -> float | None:
    """When the job's time is up: first start + timeout; None without either."""
    timeout = job.spec.scheduling.timeout_s
    if timeout is None or job.started_at is None:
        return None
    return job.started_at + timeout


def timed_out(job: Job, now: float) -> bool:
    """True once ``now`` has reached the job's deadline (never for a job without one)."""
    limit = deadline(job)
    return limit is not None and now >= limit


def timeout_error(job: Job) -> str:
    """The error a timed-out job ends with (also the reason of its interrupt request)."""
    timeout = job.spec.scheduling.timeout_s
    return f"Job exceeded its timeout of {timeout or 0:g}s"


def stopped_for_timeout(job: Job) -> bool:
    """The current attempt was told to stop because the deadline passed."""
    return job.interrupt_requested_at is not None and job.spec.scheduling.timeout_s is not None \
        and job.interrupt_reason == timeout_error(job)


def needs_stop(job: Job, now: float) -> bool:
    """A running job past its deadline that nobody has told to stop yet: the tick asks for
    its interrupt once (a job already being interrupted, for any reason, is left to end its
    attempt: the exit then fails it, see ``exits.exit_verdict``)."""
    return job.state is JobState.RUNNING and job.interrupt_requested_at is None \
        and timed_out(job, now)


def fail_between_attempts(job: Job, now: float) -> bool:
    """A job past its deadline with no workers running (requeued, waiting to restart): it is
    failed directly, without a signal."""
    return job.state in BETWEEN_ATTEMPTS and timed_out(job, now)
