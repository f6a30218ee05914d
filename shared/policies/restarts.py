"""Restarting a job after an infrastructure interruption: backoff and repeat offenders.
Pure (time is passed in) and driven by :class:`RestartConfig`.

**Backoff.** A job restarted again and again without progress (a drain loop, a node that
kills every attempt, a crash loop under ``restartJobOnWorkerRestart``) must not spin. The
*streak* counts restarts in a row whose ended attempt saved no checkpoint; an attempt that
saved one starts a new streak at 1. The first restart of a streak is immediate (a job that
trained for hours and lost a node should not wait); the n-th (n >= 2) waits
``min(cap_s, base_s * factor ** (n - 2))``: 10 s, 20 s, 40 s ... 10 min by default.
``base_s`` 0 turns the backoff off.

**Repeat offenders.** Per job, the control plane keeps the nodes with evidence against them
for the last ``offender_window`` failed attempts (the node a drain or interrupt named, a node
lost, faulty or silent at the exit). A node under at least ``offender_count`` of them is
suspected: it is kept out of the job's next placement and handed to repair as a diagnosis
(:data:`SUSPECT_FAILURE_MODE`, :data:`SUSPECT_ACTION`: the repair ladder, lemon rule and
blast-radius guard decide what happens to it). Scope: one job (the evidence lives on the job
aggregate; across jobs, the node's own failure history and the lemon rule already count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shared.domain.errors import ValidationError
from shared.domain.health import RepairAction, Severity

SUSPECT_FAILURE_MODE = "repeat_offender"
SUSPECT_SEVERITY = Severity.WARNING
# the cheapest action that takes the node out and reruns its checks before it returns
SUSPECT_ACTION = RepairAction.REBOOT


@dataclass(frozen=True)
class RestartConfig:
    backoff_base_s: float = 10.0
    backoff_factor: float = 2.0
    backoff_cap_s: float = 600.0
    offender_window: int = 3  # failed attempts of a job looked at
    offender_count: int = 2  # of those a node must be under to be suspected (0: never)

    def __post_init__(self) -> None:
        for name in ("backoff_base_s", "backoff_cap_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValidationError(name, "must be a non-negative number of seconds")
        if not math.isfinite(self.backoff_factor) or self.backoff_factor < 1:
            raise ValidationError("backoff_factor", "must be at least 1")
        if self.offender_window < 1:
            raise ValidationError("offender_window", "must be at least 1")
        if not 0 <= self.offender_count <= self.offender_window:
            raise ValidationError("offender_count", "must be between 0 and offender_window")


def next_streak(streak: int, made_progress: bool) -> int:
    """The streak after one more restart: 1 when the ended attempt made progress."""
    return 1 if made_progress else streak + 1


def backoff_delay(streak: int, config: RestartConfig) -> float:
    """Seconds the ``streak``-th restart in a row without progress waits (0: at once)."""
    if streak <= 1 or config.backoff_base_s <= 0:
        return 0.0
    exponent = min(streak - 2, 64)  # the cap is reached long before; no float overflow
    return float(min(config.backoff_cap_s, config.backoff_base_s * config.backoff_factor ** exponent))


def not_before(now: float, streak: int, config: RestartConfig) -> float | None:
    """When the restart may start; None when it may start at once."""
    delay = backoff_delay(streak, config)
    return now + delay if delay > 0 else None


def remember_failure(failed_on: Sequence[Sequence[str]], nodes: Sequence[str],
                     config: RestartConfig) -> list[list[str]]:
    """The evidence list after one more failed attempt (the newest ``offender_window``)."""
    out = [list(n) for n in failed_on] + [sorted(set(nodes))]
    return out[-config.offender_window:]


def repeat_offenders(failed_on: Sequence[Sequence[str]], config: RestartConfig) -> list[str]:
    """Nodes under at least ``offender_count`` of the last ``offender_window`` failed
    attempts, sorted."""
    if config.offender_count <= 0:
        return []
    counts: dict[str, int] = {}
    for nodes in failed_on[-config.offender_window:]:
        for node_id in set(nodes):
            counts[node_id] = counts.get(node_id, 0) + 1
    return sorted(n for n, c in counts.items() if c >= config.offender_count)


def forget(failed_on: Sequence[Sequence[str]], node_ids: Sequence[str]) -> list[list[str]]:
    """Drop suspected nodes from the evidence: they are dealt with, not suspected twice."""
    gone = set(node_ids)
    return [[n for n in nodes if n not in gone] for nodes in failed_on]


def suspect_reason(node_id: str, job_id: str, failed_on: Sequence[Sequence[str]]) -> str:
    count = sum(1 for nodes in failed_on if node_id in nodes)
    return (f"{SUSPECT_FAILURE_MODE}: under {count} of the last {len(failed_on)} failed "
            f"attempts of job {job_id}")
