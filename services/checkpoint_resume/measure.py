"""What a job measures about its own recoveries, recorded as it runs (the recovery policy
reads them back as costs: ``shared.service_layer.recovery_costs``).

* saves per tier: ``JobCheckpointSaved.tier`` (memory and peer entries are kept on
  ``Job.recovery.tiers``, the newest per tier; durable ones are ``Job.checkpoints``);
* startup, cold and warm: from an attempt's start to its ``JobFirstStep``, less the restore
  it read (warm: the attempt restarted in place or scaled down on the nodes it had);
* a decision's measured seconds: from the incident to the new attempt's first step (or, if
  no first step is reported, its first checkpoint of any tier).

Each is timed by the program's own record (``JobFirstStep.at``, ``saved_at``), not by when
an adapter's scan found it (seconds later), kept between the attempt's start and the
report: a record outside that window is a clock to distrust, not a measurement.
"""

from __future__ import annotations

from shared.domain.errors import NotFound
from shared.domain.events import JobCheckpointSaved, JobFirstStep
from shared.domain.model import Job
from shared.handling import Deps
from shared.policies.recovery import Mode, Tier
from shared.ports import UnitOfWork
from shared.service_layer.recovery_costs import restore_s

WARM_MODES = (Mode.IN_PLACE.value, Mode.SCALE_DOWN.value)


def tier_of(event: JobCheckpointSaved) -> Tier:
    try:
        return Tier(event.tier)
    except ValueError:
        return Tier.DURABLE  # an unknown tier name is read as today's only one


def record_tier(job: Job, event: JobCheckpointSaved, tier: Tier) -> bool:
    """Keep a memory or peer entry when it is newer than the one kept (idempotent)."""
    kept = job.recovery.tiers.get(tier.value)
    if kept is not None and (kept["attempt"], kept["step"]) >= (event.attempt, event.step):
        return False
    job.recovery.tiers[tier.value] = {"step": event.step, "at": event.saved_at,
                                      "attempt": event.attempt,
                                      "save_s": max(0.0, event.save_s)}
    return True


def on_first_step(event: JobFirstStep, uow: UnitOfWork, deps: Deps) -> None:
    job = uow.jobs.get(event.job_id)
    if job is None:
        raise NotFound("job", event.job_id)
    rec = job.recovery
    if event.attempt != job.attempt or rec.attempt_started_at is None:
        return  # stale, or started before the control plane recorded starts
    now = deps.clock.now()
    at = now if event.at is None else min(now, max(rec.attempt_started_at, event.at))
    warm = rec.attempt_mode in WARM_MODES
    key = "warm" if warm else "cold"
    if key + "_attempt" in rec.startup and rec.startup[key + "_attempt"] >= event.attempt:
        return  # measured already (a redelivery)
    restored = 0.0
    if warm:
        restored = restore_s(job, Tier.MEMORY, deps)
    elif job.latest_checkpoint is not None and job.attempt > 1:
        restored = restore_s(job, Tier.DURABLE, deps)
    rec.startup[key] = round(max(0.0, at - rec.attempt_started_at - restored), 3)
    rec.startup[key + "_attempt"] = event.attempt
    rec.measured(event.attempt, at)
