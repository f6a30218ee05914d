"""Small constructors so every probe builds conditions the same way.

``since`` is set to the observation time here; the agent's ``SinceTracker`` later keeps the
earlier ``since`` while a condition's status stays the same (node-problem-detector semantics).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.domain.health import Condition, ConditionStatus


def problem(ctype: str, now: float, reason: str, details: Mapping[str, Any] | None = None) -> Condition:
    return Condition(ctype, ConditionStatus.TRUE, reason, now, dict(details or {}))


def healthy(ctype: str, now: float, reason: str, details: Mapping[str, Any] | None = None) -> Condition:
    return Condition(ctype, ConditionStatus.FALSE, reason, now, dict(details or {}))


def unknown(ctype: str, now: float, reason: str, details: Mapping[str, Any] | None = None) -> Condition:
    return Condition(ctype, ConditionStatus.UNKNOWN, reason, now, dict(details or {}))
