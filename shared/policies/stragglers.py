"""Whether a straggler (``SlowInJob``) is worth moving off: its slowdown's expected cost
against a swap's. Pure; the job's costs and the time left are passed in.

A synchronous job runs at the speed of its slowest rank: with one rank at ``ratio`` x its
peers' compute time, every step takes up to ``ratio`` x as long, so over ``remaining_s``
of wall time the job loses ``remaining_s x (1 - 1/ratio)`` of progress. Moving the node
off costs what the recovery policy expects for that node leaving
(``shared.policies.recovery.choose`` on a ``node_repair`` incident: a hot swap where a spare
is ready and a peer entry exists, else a scale-down or a requeue with its wait), after
which the job runs at full speed again.

=====================  =========================================  ============
previous verdict       condition                                  verdict
=====================  =========================================  ============
wait (or none)         slowdown >= (1 + act_margin) x swap        swap
wait (or none)         otherwise                                  wait
swap                   slowdown >= (1 + keep_margin) x swap       swap
swap                   otherwise                                  wait
=====================  =========================================  ============

``keep_margin < act_margin`` is the hysteresis: a verdict near the boundary does not flap
as the job's measured costs move by a few seconds between reports.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from shared.policies import recovery
from shared.policies.recovery import Capacity, Incident, IncidentKind, JobCosts, Mode

SLOW_IN_JOB = "slow_in_job"  # the triage failure mode of a straggler


@dataclass(frozen=True)
class StragglerConfig:
    act_margin: float = 0.25  # swap when the slowdown costs 25% more than the swap
    keep_margin: float = 0.0  # a swap already chosen stands while the slowdown costs more
    # a job without a deadline (``scheduling.timeout``) is assumed to run at least this long
    # again: a guess, stated (a longer one moves stragglers sooner)
    horizon_s: float = 4 * 3600.0


@dataclass(frozen=True)
class Verdict:
    swap: bool
    slowdown_s: float  # the progress the job loses if the straggler stays
    swap_s: float  # the progress the job loses to moving it (the recovery policy's)
    mode: Mode  # how the recovery policy would move it
    why: str


def slowdown_s(ratio: float, remaining_s: float) -> float:
    """Progress lost over ``remaining_s`` of wall time at one rank ``ratio`` x slower."""
    if ratio <= 1.0 or remaining_s <= 0:
        return 0.0
    return remaining_s * (1.0 - 1.0 / ratio)


def remaining_s(now: float, started_at: float | None, timeout_s: float | None,
                config: StragglerConfig) -> float:
    """The job's expected wall time left: to its deadline, else the configured horizon."""
    if timeout_s is None or started_at is None:
        return config.horizon_s
    return max(0.0, started_at + timeout_s - now)


def decide(ratio: float, remaining: float, node_id: str, costs: JobCosts, capacity: Capacity,
           previous: bool, config: StragglerConfig) -> Verdict:
    """Swap the straggler's node, or wait, by expected cost (table above)."""
    choice = recovery.choose(Incident(IncidentKind.NODE_REPAIR, (node_id,)), costs, capacity)
    swap = choice.expected() or 0.0
    slow = slowdown_s(ratio, remaining)
    margin = config.keep_margin if previous else config.act_margin
    act = math.isfinite(swap) and slow > 0 and slow >= (1.0 + margin) * swap
    verb = "swap" if act else "wait"
    why = (f"{verb}: {ratio:.2f}x over {remaining:.0f} s left loses {slow:.0f} s; "
           f"{choice.mode} loses {swap:.0f} s (x{1.0 + margin:.2f} to act"
           f"{', kept' if previous else ''})")
    return Verdict(act, slow, swap, choice.mode, why)


_RATIO = re.compile(r"SlowInJob: ratio_to_peers=([0-9.eE+-]+)")


def ratio_from(reasons: tuple[str, ...]) -> float | None:
    """The ratio triage found (its reason ``SlowInJob: ratio_to_peers=<value>``), or None."""
    for reason in reasons:
        found = _RATIO.search(reason)
        if found:
            try:
                return float(found.group(1))
            except ValueError:
                return None
    return None
