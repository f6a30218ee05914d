"""How many replicas a deployed model wants (pure; time is passed in).

The load is requests per second over a recent window; the target, requests per second per
replica, comes from the deployed model's ``autoscalingMetricSpecs``: Vertex's
``.../prediction/online/request_count`` target is per minute per replica. A spec on a
metric mtc does not measure (CPU utilization, accelerator duty cycle) leaves the default
request target (``DEFAULT_PER_MINUTE``) in charge, so every autoscaled model has one.

* **up**: ``ceil(load / target)`` replicas, within [min, max], as soon as the up cool-down
  since the last change has passed: under-provisioning costs latency now;
* **down**: only to the count that would carry the load at ``1 - margin`` of the target
  (hysteresis: a load hovering at the target does not flap between two counts), and only
  once the longer down cool-down has passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REQUEST_COUNT = "aiplatform.googleapis.com/prediction/online/request_count"
DEFAULT_PER_MINUTE = 600  # 10 requests per second per replica


@dataclass(frozen=True)
class ScalePolicy:
    target_per_s: float
    up_cooldown_s: float = 5.0
    down_cooldown_s: float = 15.0
    down_margin: float = 0.25


@dataclass(frozen=True)
class ScaleState:
    replicas: int
    load_per_s: float
    now: float
    last_change_at: float | None
    low: int
    high: int


def policy_of(specs: Sequence[Mapping[str, object]]) -> ScalePolicy:
    """The policy of a deployed model's ``autoscalingMetricSpecs``."""
    for spec in specs:
        target = spec.get("target")
        if spec.get("metricName") == REQUEST_COUNT and isinstance(target, int) and target > 0:
            return ScalePolicy(target / 60.0)
    return ScalePolicy(DEFAULT_PER_MINUTE / 60.0)


def desired(policy: ScalePolicy, state: ScaleState) -> int:
    """The replica count to have now (``state.replicas``: no change)."""
    current = min(max(state.replicas, state.low), state.high)
    if current != state.replicas:
        return current  # out of bounds (the bounds changed): back in at once
    since = math.inf if state.last_change_at is None else state.now - state.last_change_at
    need = min(max(math.ceil(state.load_per_s / policy.target_per_s), state.low), state.high)
    if need > current:
        return need if since >= policy.up_cooldown_s else current
    relaxed = policy.target_per_s * (1.0 - policy.down_margin)
    fewer = min(max(math.ceil(state.load_per_s / relaxed), state.low), state.high)
    if fewer < current and since >= policy.down_cooldown_s:
        return fewer
    return current
