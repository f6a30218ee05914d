"""What a job has measured about its own recoveries: the inputs of the recovery policy.

* saves per tier: ``JobCheckpointSaved.tier`` (memory and peer entries are kept on
  ``Job.recovery.tiers``, the newest per tier; durable ones are ``Job.checkpoints``);
* startup, cold and warm: from an attempt's start to its ``JobFirstStep``, less the restore
  it read (warm: the attempt restarted in place or scaled down on the nodes it had);
* a decision's measured seconds: from the incident to the new attempt's first step (or, if
  no first step is reported, its first checkpoint of any tier).

Until a job measures a figure, ``deps.config.recovery`` (``RecoveryDefaults``) stands in.
A restore is not reported by programs: it is estimated as the tier's measured save
(the same bytes over the same medium), else the default.
"""

from __future__ import annotations

import math

from shared.domain.errors import NotFound
from shared.domain.events import JobCheckpointSaved, JobFirstStep
from shared.domain.model import Job
from shared.handling import Deps
from shared.policies.recovery import JobCosts, Mode, Tier, TierCost
from shared.ports import UnitOfWork

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
    warm = rec.attempt_mode in WARM_MODES
    key = "warm" if warm else "cold"
    if key + "_attempt" in rec.startup and rec.startup[key + "_attempt"] >= event.attempt:
        return  # measured already (a redelivery)
    restored = 0.0
    if warm:
        restored = restore_s(job, Tier.MEMORY, deps)
    elif job.latest_checkpoint is not None and job.attempt > 1:
        restored = restore_s(job, Tier.DURABLE, deps)
    rec.startup[key] = round(max(0.0, now - rec.attempt_started_at - restored), 3)
    rec.startup[key + "_attempt"] = event.attempt
    rec.measured(event.attempt, now)


def restore_s(job: Job, tier: Tier, deps: Deps) -> float:
    """The tier's restore estimate: its measured save, else the default."""
    if tier is Tier.DURABLE:
        saved = [c.save_s for c in job.checkpoints if c.save_s > 0]
        measured = saved[-1] if saved else 0.0
    else:
        measured = float(job.recovery.tiers.get(tier.value, {}).get("save_s", 0.0))
    return measured if measured > 0 else deps.config.recovery.restore_s(tier)


def costs(job: Job, fault_at: float, deps: Deps) -> JobCosts:
    """The job's costs at an incident at ``fault_at``: per tier, its restore and the progress
    since its newest entry (an entry saved after the fault, such as the durable save on
    SIGTERM, loses nothing; no durable entry at all loses everything since the start)."""
    defaults = deps.config.recovery
    tiers = []
    for tier in (Tier.MEMORY, Tier.PEER):
        entry = job.recovery.tiers.get(tier.value)
        lost = math.inf if entry is None else max(0.0, fault_at - float(entry["at"]))
        tiers.append(TierCost(tier, restore_s(job, tier, deps), lost))
    latest = job.latest_checkpoint
    if latest is not None:
        tiers.append(TierCost(Tier.DURABLE, restore_s(job, Tier.DURABLE, deps),
                              max(0.0, fault_at - latest.at)))
    else:  # from the start: no restore, everything since the job started is lost
        since = job.started_at if job.started_at is not None else fault_at
        tiers.append(TierCost(Tier.DURABLE, 0.0, max(0.0, fault_at - since)))
    startup = job.recovery.startup
    # one measured, the other not: a warm start is never slower than a cold one, nor a cold
    # one faster than a warm one (a default must not make the unmeasured side look better)
    cold = float(startup.get("cold", defaults.startup_cold_s))
    warm = float(startup.get("warm", defaults.startup_warm_s))
    if "warm" not in startup:
        warm = min(warm, cold)
    if "cold" not in startup:
        cold = max(cold, warm)
    return JobCosts(step_s=defaults.step_s,
                    startup_cold_s=cold, startup_warm_s=warm,
                    tiers=tuple(tiers))
