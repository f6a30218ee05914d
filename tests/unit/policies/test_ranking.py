"""The one ordering of actions and severities the whole control plane shares."""

from __future__ import annotations

from shared.domain.health import RepairAction, Severity
from shared.policies.ranking import (
    ACTION_ORDER,
    action_rank,
    worst_action,
    worst_severity,
)

A = RepairAction


def test_action_order_is_total_and_documented() -> None:
    assert set(ACTION_ORDER) == set(RepairAction)
    assert ACTION_ORDER == (
        A.NONE,
        A.RESTART_JOB,
        A.RESET_GPU,
        A.REBOOT,
        A.REIMAGE,
        A.MANUAL,
        A.REPLACE,
    )
    assert action_rank(A.MANUAL) > action_rank(A.REIMAGE)
    assert action_rank(A.REPLACE) > action_rank(A.MANUAL)


def test_worst_wins() -> None:
    assert worst_action([A.REBOOT, A.RESET_GPU, A.NONE]) is A.REBOOT
    assert worst_action([A.MANUAL, A.REPLACE]) is A.REPLACE
    assert worst_action([]) is A.NONE
    assert worst_severity([Severity.INFO, Severity.CRITICAL, Severity.WARNING]) is Severity.CRITICAL
    assert worst_severity([]) is Severity.OK
