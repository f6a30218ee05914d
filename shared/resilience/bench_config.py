"""The control plane's settings for a benchmark run, the same live and in the twin.

The repair policy's blast-radius guard is sized for fleets (a quarter of a partition out of
service, at least one node): on the benchmark's five nodes it would hold the second node
fault's repair for an hour, and the benchmark would measure the guard, not the recovery. So
a benchmark allows every node of its small cluster out at once; everything else is the
default (the demo's grace period and heartbeat timeout).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from shared.config import ControlPlaneConfig
from shared.policies.repair import load_repair_config

BENCH_REPAIR: Mapping[str, Any] = MappingProxyType({
    "max_out_of_service_fraction": 1.0, "min_out_of_service_allowed": 64,
    "max_removals_in_window": 64})
GRACE_PERIOD_S = 10.0
HEARTBEAT_TIMEOUT_S = 30


def bench_config(base: ControlPlaneConfig | None = None) -> ControlPlaneConfig:
    return replace(base or ControlPlaneConfig(), grace_period_s=GRACE_PERIOD_S,
                   heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
                   repair=load_repair_config(dict(BENCH_REPAIR)))
