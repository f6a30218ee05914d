"""The live run's recovery costs and policy inputs, for the twin (``simulator.bench_costs``).

Read from the job's record with the same estimates the recovery policy uses
(``shared.service_layer.recovery_costs``), and from the run's event log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.domain.model import Job
from shared.handling import Deps
from shared.policies.recovery import Tier
from shared.service_layer.recovery_costs import restore_s
from simulator.bench_costs import measured_inputs


def live_costs(rows: Sequence[Mapping[str, Any]], job_id: str, job: Job | None,
               deps: Deps) -> dict[str, Any]:
    out = measured_inputs(rows, job_id)
    if job is None:
        return out
    # a restore is estimated as the tier's measured save (the policy's own estimate), and
    # only where one was measured: the policy's default stands in for none, not a live figure
    for tier in Tier:
        if tier is Tier.DURABLE:
            measured = any(c.save_s > 0 for c in job.checkpoints)
        else:
            measured = float(job.recovery.tiers.get(tier.value, {}).get("save_s", 0.0)) > 0
        if measured:
            out[f"restore_{tier.value}_s"] = round(restore_s(job, tier, deps), 6)
    startup = job.recovery.startup
    for key in ("cold", "warm"):
        if key in startup:
            out[f"measured_{key}_startup_s"] = float(startup[key])
    return out
