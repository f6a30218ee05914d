"""A job's recovery costs at an incident, from what it has measured about its own recoveries
(``services.checkpoint_resume.measure`` records them): the inputs of the recovery policy,
read when an attempt ends and when a straggler is weighed.

Until a job measures a figure, ``deps.config.recovery`` (``RecoveryDefaults``) stands in.
A restore is not reported by programs: it is estimated as the tier's measured save
(the same bytes over the same medium), else the default.
"""

from __future__ import annotations

import math

from shared.domain.model import Job
from shared.handling import Deps
from shared.policies.recovery import JobCosts, Tier, TierCost


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
