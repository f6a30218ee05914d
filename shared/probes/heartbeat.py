"""HeartbeatLost, computed by the monitor (not the node): an agent that stops reporting
cannot say so itself, so its liveness is implied by its reports arriving."""

from __future__ import annotations

from shared.domain.health import Condition, ConditionType
from shared.probes.conditions import healthy, problem, unknown

CTYPE = ConditionType.HEARTBEAT_LOST.value


def heartbeat_condition(last_seen: float | None, now: float, timeout_s: float) -> Condition:
    """True once the node has been silent for more than ``timeout_s``. ``since`` is derived from
    ``last_seen`` (the moment the node crossed the timeout, or its last report), not from
    ``now``, so recomputing it later or on a replayed stream gives the same answer."""
    if last_seen is None:
        return unknown(CTYPE, now, "no report seen from this node yet", {"silent_for_s": None})
    silent = max(0.0, now - last_seen)
    details = {"silent_for_s": round(silent, 3), "timeout_s": timeout_s, "last_seen": last_seen}
    if silent > timeout_s:
        reason = f"no report for {silent:.0f}s (timeout {timeout_s:g}s)"
        return problem(CTYPE, now, reason, details, since=last_seen + timeout_s)
    return healthy(CTYPE, now, f"last report {silent:.0f}s ago", details, since=last_seen)
