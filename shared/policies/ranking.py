"""How bad an action or a severity is, so that several findings combine as "worst wins".

One ordering for the whole control plane: triage, the repair ladder and the simulator must
agree on which of two actions is the bigger one, so it lives here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.domain.health import RepairAction, Severity

# MANUAL sits above REIMAGE (a person must look before automation wipes the evidence) and below
# REPLACE (replacing the machine settles whatever a person would have looked for).
ACTION_ORDER: tuple[RepairAction, ...] = (
    RepairAction.NONE,
    RepairAction.RESTART_JOB,
    RepairAction.RESET_GPU,
    RepairAction.REBOOT,
    RepairAction.REIMAGE,
    RepairAction.MANUAL,
    RepairAction.REPLACE,
)

SEVERITY_ORDER: tuple[Severity, ...] = (
    Severity.OK,
    Severity.INFO,
    Severity.WARNING,
    Severity.CRITICAL,
)

_ACTION_RANK = {action: rank for rank, action in enumerate(ACTION_ORDER)}
_SEVERITY_RANK = {severity: rank for rank, severity in enumerate(SEVERITY_ORDER)}


def action_rank(action: RepairAction) -> int:
    """Position of ``action`` in :data:`ACTION_ORDER` (0 = do nothing)."""
    return _ACTION_RANK[action]


def severity_rank(severity: Severity) -> int:
    """Position of ``severity`` in :data:`SEVERITY_ORDER` (0 = ok)."""
    return _SEVERITY_RANK[severity]


def worst_action(actions: Iterable[RepairAction]) -> RepairAction:
    """The most disruptive of ``actions``; NONE when there are none."""
    return max(actions, key=action_rank, default=RepairAction.NONE)


def worst_severity(severities: Iterable[Severity]) -> Severity:
    """The most severe of ``severities``; OK when there are none."""
    return max(severities, key=severity_rank, default=Severity.OK)
