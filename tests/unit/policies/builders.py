"""Small builders for policy tests: conditions, reports and failure records."""

from __future__ import annotations

from typing import Any

from shared.domain.health import (
    Condition,
    ConditionStatus,
    FailureRecord,
    HealthReport,
    RepairAction,
)

NOW = 1_000_000.0


def cond(ctype: str, status: str = "true", /, **details: Any) -> Condition:
    return Condition(ctype, ConditionStatus(status), "test", NOW - 10, details)


def xid(*codes: int, **details: Any) -> Condition:
    return cond("XidError", xids=list(codes), **details)


def report(*conditions: Condition, node_id: str = "n1") -> HealthReport:
    return HealthReport(node_id=node_id, observed_at=NOW, conditions=tuple(conditions))


def seen(mode: str, ago_s: float, action: RepairAction = RepairAction.NONE) -> FailureRecord:
    """A history record ``ago_s`` seconds before NOW."""
    return FailureRecord(at=NOW - ago_s, failure_mode=mode, action=action)
