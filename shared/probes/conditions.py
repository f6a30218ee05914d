"""Small constructors so every probe builds conditions the same way.

``since`` defaults to the observation time; the agent's ``SinceTracker`` later keeps the
earlier ``since`` while a condition's status stays the same (node-problem-detector semantics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.domain.health import Condition, ConditionStatus

Details = Mapping[str, Any] | None


def problem(
    ctype: str, now: float, reason: str, details: Details = None, *, since: float | None = None
) -> Condition:
    return Condition(
        ctype, ConditionStatus.TRUE, reason, now if since is None else since, dict(details or {})
    )


def healthy(
    ctype: str, now: float, reason: str, details: Details = None, *, since: float | None = None
) -> Condition:
    return Condition(
        ctype, ConditionStatus.FALSE, reason, now if since is None else since, dict(details or {})
    )


def unknown(
    ctype: str, now: float, reason: str, details: Details = None, *, since: float | None = None
) -> Condition:
    return Condition(
        ctype, ConditionStatus.UNKNOWN, reason, now if since is None else since, dict(details or {})
    )
