"""The deep-check gate's policy: when checks are wanted, the verdict, what a verdict allows."""

from __future__ import annotations

import pytest

from shared.domain.errors import ValidationError
from shared.domain.health import Condition, ConditionStatus
from shared.policies.repair import (
    PENDING,
    RepairConfig,
    deep_check_verdict,
    deep_check_wanted,
    gate_allows_return,
    load_repair_config,
)

ALL = RepairConfig(deep_checks_on=frozenset({"first_join", "reimage", "replace"}))
NONE = RepairConfig()
HOLD = RepairConfig(deep_checks_on=frozenset({"first_join"}), deep_check_on_unknown="hold")


@pytest.mark.parametrize(("trigger", "gate", "config", "wanted"), [
    ("first_join", None, ALL, True),
    ("replace", None, ALL, True),
    ("reimage", "false", ALL, True),
    ("repair", None, ALL, False),  # a reboot of a node that passed: no deep check
    ("repair", "false", ALL, False),
    ("repair", "true", ALL, True),  # it failed them: it passes them again before it returns
    ("repair", "true", NONE, True),
    ("first_join", None, NONE, False),  # off by default
    ("reimage", "unknown", HOLD, False),
])
def test_when_deep_checks_are_wanted(trigger: str, gate: str | None, config: RepairConfig,
                                     wanted: bool) -> None:
    assert deep_check_wanted(trigger, gate, config) is wanted


def cond(ctype: str, status: str, **details: object) -> Condition:
    return Condition(ctype, ConditionStatus(status), f"{ctype} {status}", 0.0, dict(details))


DCGM, BW = "DcgmDiagFailed", "CollectiveBandwidthLow"


@pytest.mark.parametrize(("conditions", "status", "failed", "unknown"), [
    ([cond(DCGM, "false"), cond(BW, "false")], "false", 0, 0),
    ([cond(DCGM, "true"), cond(BW, "false")], "true", 1, 0),
    ([cond(DCGM, "false"), cond(BW, "true")], "true", 1, 0),
    ([cond(DCGM, "true"), cond(BW, "unknown")], "true", 1, 1),  # a failure wins
    ([cond(DCGM, "false"), cond(BW, "unknown")], "unknown", 0, 1),  # never "passed"
    ([cond(DCGM, "false")], "unknown", 0, 1),  # a check missing from the results
    ([], "unknown", 0, 2),
    ([cond(DCGM, "false"), cond(BW, "false"), cond("XidError", "true")], "false", 0, 0),
])
def test_the_verdict(conditions: list[Condition], status: str, failed: int,
                     unknown: int) -> None:
    verdict = deep_check_verdict(conditions, level=3)
    assert verdict.status.value == status
    assert (len(verdict.failed), len(verdict.unknown)) == (failed, unknown)
    assert "dcgm level 3" in verdict.reason


@pytest.mark.parametrize(("status", "reason", "config", "allowed"), [
    (None, "", ALL, True),  # never asked for: nothing to gate
    ("false", "deep checks passed", ALL, True),
    ("true", "deep checks failed: x", ALL, False),
    ("unknown", "deep checks could not tell: y", ALL, True),  # default: pass, recorded
    ("unknown", "deep checks could not tell: y", HOLD, False),
    ("unknown", f"{PENDING}: deep checks before service", ALL, False),
    ("unknown", f"{PENDING}: deep checks before service", HOLD, False),
    ("true", "deep checks failed: x", HOLD, False),
    ("false", "deep checks passed", HOLD, True),
])
def test_what_a_verdict_allows(status: str | None, reason: str, config: RepairConfig,
                               allowed: bool) -> None:
    assert gate_allows_return(status, reason, config) is allowed


def test_configuration_is_checked_and_loaded() -> None:
    with pytest.raises(ValidationError) as err:
        RepairConfig(deep_checks_on=frozenset({"reboot"}))
    assert err.value.path == "deep_checks_on"
    with pytest.raises(ValidationError) as err:
        RepairConfig(deep_check_on_unknown="ok")
    assert err.value.path == "deep_check_on_unknown"
    loaded = load_repair_config({"deep_checks_on": ["first_join", "reimage"],
                                 "deep_check_on_unknown": "hold"})
    assert loaded.deep_checks_on == frozenset({"first_join", "reimage"})
    assert loaded.deep_check_on_unknown == "hold"
    with pytest.raises(ValidationError, match="list of triggers"):
        load_repair_config({"deep_checks_on": "first_join"})
