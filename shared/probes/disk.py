"""DiskPressure: the used share of the root and scratch file systems.

A full scratch disk kills checkpoints (and so the job's progress) before it kills anything
else, so the condition reports the worst mount and every mount's share.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from shared.domain.health import Condition, ConditionType
from shared.probes.conditions import healthy, problem, unknown

CTYPE = ConditionType.DISK_PRESSURE.value


class Usage(NamedTuple):
    total: int
    used: int
    free: int


UsageFn = Callable[[str], Usage]


def _disk_usage(path: str) -> Usage:
    total, used, free = shutil.disk_usage(path)
    return Usage(total, used, free)


def probe(
    mounts: Sequence[str],
    now: float,
    *,
    threshold: float = 0.9,
    usage: UsageFn = _disk_usage,
) -> Condition:
    """True if any mount is at or over ``threshold``; unknown if some mount could not be read
    and none is over (a partial check must not read as healthy)."""
    if not mounts:
        return unknown(CTYPE, now, "no mounts configured")
    fractions: dict[str, float] = {}
    errors: dict[str, str] = {}
    for mount in mounts:
        try:
            u = usage(mount)
        except OSError as exc:
            errors[mount] = exc.strerror or str(exc)
            continue
        # Like df: used / (used + available to unprivileged users), not used / total.
        denominator = u.used + u.free
        fractions[mount] = round(u.used / denominator, 4) if denominator > 0 else 1.0
    details: dict[str, Any] = {"mounts": fractions, "threshold": threshold}
    if errors:
        details["errors"] = errors
    if fractions:
        worst = max(fractions, key=lambda m: fractions[m])
        details.update(mount=worst, used_fraction=fractions[worst])
        if fractions[worst] >= threshold:
            return problem(CTYPE, now, f"{worst} is {fractions[worst]:.0%} full", details)
    if errors:
        listed = ", ".join(f"{m}: {e}" for m, e in errors.items())
        return unknown(CTYPE, now, f"cannot read disk usage of {listed}", details)
    return healthy(CTYPE, now, f"all mounts below {threshold:.0%}", details)
