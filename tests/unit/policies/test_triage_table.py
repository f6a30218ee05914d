"""The packaged triage table: every XID row, the reference classes, and strict validation."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.domain.errors import ValidationError
from shared.domain.health import ConditionType, RepairAction, Severity
from shared.policies.triage import load_triage_table, triage
from shared.policies.triage_table import DEFAULT_TABLE_PATH, parse_triage_table
from tests.unit.policies.builders import NOW, report, xid

TABLE = load_triage_table()


def _codes(*items: int | range) -> set[int]:
    out: set[int] = set()
    for item in items:
        out.update(item if isinstance(item, range) else [item])
    return out


# Written out by hand from the "Immediate action" column of NVIDIA's XID catalog
# (docs.nvidia.com/deploy/xid-errors), independent of the YAML, so the table cannot drift from
# the catalog without a test failing.
REFERENCE: dict[RepairAction, set[int]] = {
    RepairAction.RESET_GPU: _codes(46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158)
    | {48, 74}
    | _codes(range(144, 151)),
    RepairAction.REBOOT: {79, 151},
    RepairAction.RESTART_JOB: _codes(
        8, 11, 13, 31, 94, range(68, 73), range(80, 87), range(96, 106), range(126, 136)
    ),
    RepairAction.NONE: _codes(
        14, 37, 38, 43, 44, 63, 66, 67, 92, 93, range(106, 109), 121, 137, 141, 152, 153, 157
    )
    | {160, 161, 45},
    RepairAction.MANUAL: {54, 159, 78},
}
REFERENCE_154 = 154  # "the log line names the recovery action"; default reset


REFERENCE_PAIRS: list[tuple[RepairAction, int]] = sorted(
    ((action, code) for action, codes in REFERENCE.items() for code in codes),
    key=lambda pair: pair[1],
)


def _raw() -> dict[str, Any]:
    data = yaml.safe_load(DEFAULT_TABLE_PATH.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return copy.deepcopy(data)


def test_default_table_loads_as_version_1() -> None:
    assert TABLE.version == 1
    assert load_triage_table() is TABLE  # the packaged table is read once


def test_every_condition_type_except_xid_has_a_rule() -> None:
    expected = {t.value for t in ConditionType} - {ConditionType.XID_ERROR.value}
    assert set(TABLE.conditions) == expected


def test_table_maps_exactly_the_reference_codes() -> None:
    reference_codes = set().union(*REFERENCE.values()) | {REFERENCE_154}
    assert set(TABLE.xid_rules) == reference_codes


@pytest.mark.parametrize(
    ("action", "code"),
    REFERENCE_PAIRS,
)
def test_reference_class(action: RepairAction, code: int) -> None:
    rule = TABLE.xid_rules[code]
    assert rule.action is action
    expected = {
        RepairAction.NONE: Severity.INFO,
        RepairAction.RESTART_JOB: Severity.WARNING,
    }.get(action, Severity.CRITICAL)
    assert rule.severity is expected


@pytest.mark.parametrize("code", sorted(TABLE.xid_rules))
def test_every_xid_row_drives_triage(code: int) -> None:
    rule = TABLE.xid_rules[code]
    diagnosis = triage(report(xid(code)), [], NOW, TABLE)
    assert diagnosis.action is rule.action
    assert diagnosis.severity is rule.severity
    benign = rule.action is RepairAction.NONE and rule.severity in (Severity.OK, Severity.INFO)
    assert diagnosis.failure_mode == ("healthy" if benign else rule.failure_mode)
    assert diagnosis.healthy is benign
    assert diagnosis.unmapped_xids == ()
    assert any(f"XID {code}" in reason for reason in diagnosis.reasons)


@pytest.mark.parametrize(
    ("code", "action", "mode"),
    [
        (79, RepairAction.REBOOT, "gpu_fell_off_bus"),
        (48, RepairAction.RESET_GPU, "double_bit_ecc"),
        (13, RepairAction.RESTART_JOB, "graphics_engine_exception"),
        (31, RepairAction.RESTART_JOB, "gpu_memory_page_fault"),
        (43, RepairAction.NONE, "app_fault_channel_reset"),
        (74, RepairAction.RESET_GPU, "nvlink_error"),
        (147, RepairAction.RESET_GPU, "nvlink_error"),
        (151, RepairAction.REBOOT, "vm_restart_required"),
        (154, RepairAction.RESET_GPU, "gpu_recovery_action_changed"),
        (54, RepairAction.MANUAL, "aux_power_or_mechanical"),
        (78, RepairAction.MANUAL, "software_firmware_update_needed"),
        (159, RepairAction.MANUAL, "uvm_error"),
    ],
)
def test_hand_checked_rows(code: int, action: RepairAction, mode: str) -> None:
    assert TABLE.xid_rules[code].action is action
    assert TABLE.xid_rules[code].failure_mode == mode


def test_unmapped_default_is_explicit() -> None:
    assert TABLE.unmapped_xid.failure_mode == "unmapped_xid"
    assert TABLE.unmapped_xid.severity is Severity.WARNING
    assert TABLE.unmapped_xid.action is RepairAction.RESTART_JOB
    assert 999 not in TABLE.xid_rules


def test_co_occurrence_and_recovery_codes() -> None:
    assert TABLE.defer_when_co_occurring == frozenset({45})
    assert TABLE.recovery_action_codes == frozenset({154})
    assert TABLE.recovery_actions["node_reboot"] is RepairAction.REBOOT
    assert TABLE.recovery_actions["drain_and_reset"] is RepairAction.RESET_GPU


def test_load_from_explicit_path(tmp_path: Path) -> None:
    raw = _raw()
    raw["xid"]["rules"][0]["action"] = "reboot"  # codes [46]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    table = load_triage_table(path)
    assert table.xid_rules[46].action is RepairAction.REBOOT
    assert TABLE.xid_rules[46].action is RepairAction.RESET_GPU  # the default is untouched


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("version: [1\n", encoding="utf-8")
    with pytest.raises(ValidationError) as err:
        load_triage_table(path)
    assert err.value.path == str(path)


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


@pytest.mark.parametrize(
    ("dotted", "value", "path"),
    [
        ("version", 2, "version"),
        ("version", "1", "version"),
        ("xid.rules.0.action", "explode", "xid.rules[0].action"),
        ("xid.rules.0.severity", "fatal", "xid.rules[0].severity"),
        ("xid.rules.0.failure_mode", "Bad Mode", "xid.rules[0].failure_mode"),
        ("xid.rules.0.failure_mode", "healthy", "xid.rules[0].failure_mode"),
        ("xid.rules.0.codes", ["50-40"], "xid.rules[0].codes[0]"),
        ("xid.rules.0.codes", [-1], "xid.rules[0].codes[0]"),
        ("xid.rules.0.codes", [], "xid.rules[0].codes"),
        ("xid.defer_when_co_occurring", [777], "xid.defer_when_co_occurring"),
        ("xid.unmapped", None, "xid.unmapped"),
        ("xid.recovery_actions.node_reboot", "dance", "xid.recovery_actions.node_reboot"),
        ("conditions.DiskPressure.kind", "fuzzy", "conditions.DiskPressure.kind"),
        (
            "conditions.DiskPressure.tiers.0.at_least",
            "high",
            "conditions.DiskPressure.tiers[0].at_least",
        ),
        (
            "conditions.SlowSpeedCheck.tiers.0.confirm.count",
            0,
            "conditions.SlowSpeedCheck.tiers[0].confirm.count",
        ),
        (
            "conditions.SlowSpeedCheck.tiers.1.confirm.unconfirmed_action",
            "reimage",  # more disruptive than the confirmed reboot
            "conditions.SlowSpeedCheck.tiers[1].confirm.unconfirmed_action",
        ),
        (
            "conditions.SlowSpeedCheck.tiers.0.confirm.counts_modes",
            ["slow_node"],
            "conditions.SlowSpeedCheck.tiers[0].confirm.counts_modes",
        ),
        ("conditions.NvlinkDown", {"kind": "flags"}, "conditions.NvlinkDown"),
        ("surprise", 1, "surprise"),
    ],
)
def test_validation_names_the_bad_key(dotted: str, value: Any, path: str) -> None:
    raw = _raw()
    _set(raw, dotted, value)
    with pytest.raises(ValidationError) as err:
        parse_triage_table(raw)
    assert err.value.path == path


def test_duplicate_code_names_the_second_row() -> None:
    raw = _raw()
    last = len(raw["xid"]["rules"]) - 1
    raw["xid"]["rules"][last]["codes"] = [46]  # row 0 maps 46 already
    with pytest.raises(ValidationError) as err:
        parse_triage_table(raw)
    assert err.value.path == f"xid.rules[{last}].codes"
    assert "xid.rules[0]" in err.value.reason


def test_missing_condition_rule_is_an_error() -> None:
    raw = _raw()
    del raw["conditions"]["HeartbeatLost"]
    with pytest.raises(ValidationError) as err:
        parse_triage_table(raw)
    assert err.value.path == "conditions.HeartbeatLost"


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ValidationError):
        parse_triage_table([1, 2])
