"""triage(): XID rules, thresholds, confirmation, unknown checks, worst-wins combination."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.health import Condition, Diagnosis, FailureRecord, RepairAction, Severity
from shared.policies.ranking import worst_action
from shared.policies.triage import load_triage_table, triage, unconfirmed_sightings
from tests.unit.policies.builders import NOW, cond, report, seen, xid

TABLE = load_triage_table()


def diagnose(*conditions: Condition, history: tuple[FailureRecord, ...] = ()) -> Diagnosis:
    return triage(report(*conditions), list(history), NOW, TABLE)


# --- XIDs --------------------------------------------------------------------------------------


def test_xid_79_reboots() -> None:
    d = diagnose(xid(79))
    assert (d.failure_mode, d.severity, d.action) == (
        "gpu_fell_off_bus",
        Severity.CRITICAL,
        RepairAction.REBOOT,
    )


def test_xid_48_resets_the_gpu() -> None:
    assert diagnose(xid(48)).action is RepairAction.RESET_GPU


def test_xid_13_restarts_the_job() -> None:
    d = diagnose(xid(13))
    assert d.action is RepairAction.RESTART_JOB
    assert d.severity is Severity.WARNING
    assert not d.healthy


def test_xid_43_is_ignored() -> None:
    d = diagnose(xid(43))
    assert d.action is RepairAction.NONE
    assert d.failure_mode == "healthy"
    assert d.severity is Severity.INFO
    assert d.healthy


def test_lone_45_is_benign() -> None:
    d = diagnose(xid(45))
    assert d.action is RepairAction.NONE
    assert d.healthy
    assert d.reasons and "XID 45" in d.reasons[0]


def test_45_with_79_acts_on_79_only() -> None:
    d = diagnose(xid(45, 79))
    assert d.action is RepairAction.REBOOT
    assert d.failure_mode == "gpu_fell_off_bus"
    assert not any("XID 45" in r for r in d.reasons)


def test_45_defers_to_an_xid_in_another_condition() -> None:
    d = diagnose(xid(45), xid(13))
    assert d.action is RepairAction.RESTART_JOB
    assert not any("XID 45" in r for r in d.reasons)


def test_45_with_a_benign_xid_stays_benign() -> None:
    assert diagnose(xid(45, 43)).healthy


def test_unmapped_xid_gets_the_default_and_is_reported() -> None:
    d = diagnose(xid(999))
    assert d.failure_mode == "unmapped_xid"
    assert d.severity is Severity.WARNING
    assert d.action is RepairAction.RESTART_JOB
    assert d.unmapped_xids == (999,)


def test_unmapped_xids_are_reported_even_when_another_xid_wins() -> None:
    d = diagnose(xid(999, 79, 1234, 999))
    assert d.action is RepairAction.REBOOT
    assert d.unmapped_xids == (999, 1234)


def test_45_with_an_unmapped_xid_acts_on_the_unmapped_one() -> None:
    d = diagnose(xid(45, 999))
    assert d.unmapped_xids == (999,)
    assert d.action is RepairAction.RESTART_JOB


def test_xid_codes_given_as_strings_are_read() -> None:
    assert diagnose(cond("XidError", xids=["79"])).action is RepairAction.REBOOT


def test_xid_error_without_codes_uses_the_default() -> None:
    d = diagnose(cond("XidError"))
    assert d.failure_mode == "unmapped_xid"
    assert d.action is RepairAction.RESTART_JOB
    assert d.unmapped_xids == ()


def test_duplicate_xids_give_one_reason() -> None:
    d = diagnose(xid(79, 79), xid(79))
    assert len(d.reasons) == 1


@pytest.mark.parametrize(
    ("named", "action"),
    [
        ("gpu_reset", RepairAction.RESET_GPU),
        ("node_reboot", RepairAction.REBOOT),
        ("Node Reboot Required", RepairAction.REBOOT),
        ("drain-and-reset", RepairAction.RESET_GPU),
        ("drain_p2p", RepairAction.RESET_GPU),
        ("teleport", RepairAction.RESET_GPU),  # unknown name: the 154 row's default
        ("", RepairAction.RESET_GPU),
    ],
)
def test_xid_154_uses_the_named_recovery_action(named: str, action: RepairAction) -> None:
    d = diagnose(xid(154, recovery_action=named))
    assert d.action is action
    assert d.failure_mode == "gpu_recovery_action_changed"


def test_xid_154_without_details_resets() -> None:
    assert diagnose(xid(154)).action is RepairAction.RESET_GPU


def test_xid_154_with_recovery_none_is_benign() -> None:
    d = diagnose(xid(154, recovery_action="none"))
    assert d.action is RepairAction.NONE
    assert d.healthy


# --- other conditions and thresholds -------------------------------------------------------------


@pytest.mark.parametrize(
    ("details", "mode", "severity", "action"),
    [
        ({"volatile_dbe": 2, "aggregate_dbe": 5}, "uncorrectable_ecc", "critical", "reset_gpu"),
        ({"volatile_dbe": 0, "aggregate_dbe": 5}, "uncorrectable_ecc_history", "warning", "none"),
        ({}, "uncorrectable_ecc", "critical", "reset_gpu"),
    ],
)
def test_ecc(details: dict[str, int], mode: str, severity: str, action: str) -> None:
    d = diagnose(cond("EccUncorrectable", **details))
    assert (d.failure_mode, d.severity.value, d.action.value) == (mode, severity, action)


@pytest.mark.parametrize(
    ("details", "mode", "action"),
    [
        ({"failure": True, "pending": False}, "row_remap_failure", RepairAction.REPLACE),
        ({"failure": False, "pending": True}, "row_remap_pending", RepairAction.RESET_GPU),
        ({"failure": True, "pending": True}, "row_remap_failure", RepairAction.REPLACE),
        ({}, "row_remap_pending", RepairAction.RESET_GPU),
    ],
)
def test_row_remap(details: dict[str, bool], mode: str, action: RepairAction) -> None:
    d = diagnose(cond("RowRemapFailure", **details))
    assert (d.failure_mode, d.action) == (mode, action)


@pytest.mark.parametrize(
    ("level", "action"),
    [
        (1, RepairAction.REBOOT),
        (2, RepairAction.REIMAGE),
        ("2", RepairAction.REIMAGE),
        (2.0, RepairAction.REIMAGE),
        (7, RepairAction.REIMAGE),  # unknown level: like level 2
        (None, RepairAction.REBOOT),  # no level (e.g. dcgmi timed out)
    ],
)
def test_dcgm_levels(level: object, action: RepairAction) -> None:
    details = {} if level is None else {"level": level, "failed_tests": ["pcie"]}
    d = diagnose(cond("DcgmDiagFailed", **details))
    assert d.action is action
    assert d.severity is Severity.CRITICAL


@pytest.mark.parametrize("level", [3, 4])
def test_dcgm_long_levels_reboot_first_then_replace(level: int) -> None:
    first = diagnose(cond("DcgmDiagFailed", level=level))
    assert first.action is RepairAction.REBOOT
    assert first.severity is Severity.WARNING
    assert first.failure_mode == "dcgm_diag_hardware_failed"
    again = diagnose(
        cond("DcgmDiagFailed", level=level),
        history=(seen("dcgm_diag_hardware_failed", 3600, RepairAction.REBOOT),),
    )
    assert again.action is RepairAction.REPLACE
    assert again.severity is Severity.CRITICAL
    stale = diagnose(
        cond("DcgmDiagFailed", level=level),
        history=(seen("dcgm_diag_hardware_failed", 2 * 86400, RepairAction.REBOOT),),
    )
    assert stale.action is RepairAction.REBOOT


def test_thermal_below_critical_only_warns_even_when_repeated() -> None:
    history = tuple(seen("thermal_throttling", 60 * i) for i in range(1, 10))
    d = diagnose(cond("ThermalThrottling", temperature_c=85.0), history=history)
    assert (d.failure_mode, d.severity, d.action) == (
        "thermal_throttling",
        Severity.WARNING,
        RepairAction.NONE,
    )


def test_thermal_critical_needs_three_sightings_within_the_hour() -> None:
    hot = cond("ThermalThrottling", temperature_c=95.0)
    once = diagnose(hot)
    assert (once.failure_mode, once.severity, once.action) == (
        "thermal_critical",
        Severity.WARNING,
        RepairAction.NONE,
    )
    twice = diagnose(hot, history=(seen("thermal_critical", 600),))
    assert twice.action is RepairAction.NONE
    thrice = diagnose(hot, history=(seen("thermal_critical", 600), seen("thermal_critical", 1200)))
    assert (thrice.severity, thrice.action) == (Severity.CRITICAL, RepairAction.REBOOT)


def test_confirmation_ignores_old_future_and_other_sightings() -> None:
    hot = cond("ThermalThrottling", temperature_c=95.0)
    history = (
        seen("thermal_critical", 3601),  # outside the window
        seen("thermal_critical", 0),  # at now: not an earlier sighting
        seen("thermal_critical", -60),  # in the future
        seen("thermal_throttling", 60),  # another mode
        seen("thermal_critical", 60),
    )
    assert diagnose(hot, history=history).action is RepairAction.NONE


def test_thermal_without_temperature_warns() -> None:
    d = diagnose(cond("ThermalThrottling", reasons=["hw_slowdown"]))
    assert (d.severity, d.action) == (Severity.WARNING, RepairAction.NONE)


@pytest.mark.parametrize(
    ("used", "mode", "severity", "action"),
    [
        (0.5, "healthy", Severity.INFO, RepairAction.NONE),
        (0.8999, "healthy", Severity.INFO, RepairAction.NONE),
        (0.90, "disk_pressure", Severity.WARNING, RepairAction.NONE),
        (0.979, "disk_pressure", Severity.WARNING, RepairAction.NONE),
        (0.98, "disk_full", Severity.CRITICAL, RepairAction.REIMAGE),
        (1.0, "disk_full", Severity.CRITICAL, RepairAction.REIMAGE),
        (None, "disk_pressure", Severity.WARNING, RepairAction.NONE),
    ],
)
def test_disk_pressure(
    used: float | None, mode: str, severity: Severity, action: RepairAction
) -> None:
    details = {"mount": "/"} if used is None else {"mount": "/", "used_fraction": used}
    d = diagnose(cond("DiskPressure", **details))
    assert (d.failure_mode, d.severity, d.action) == (mode, severity, action)


@pytest.mark.parametrize(
    ("ratio", "history", "mode", "action"),
    [
        (0.95, (), "healthy", RepairAction.NONE),
        (0.8, (), "healthy", RepairAction.NONE),  # the band is strictly below 0.8
        (0.7, (), "slow_node", RepairAction.NONE),  # unconfirmed
        (0.7, (("slow_node", 600),), "slow_node", RepairAction.REBOOT),
        (0.7, (("slow_node", 4000),), "slow_node", RepairAction.NONE),  # outside the hour
        (0.5, (("slow_node", 600),), "slow_node", RepairAction.REBOOT),
        (0.4, (), "severely_slow_node", RepairAction.NONE),
        (0.4, (("severely_slow_node", 600),), "severely_slow_node", RepairAction.REPLACE),
        # An earlier mild slowdown confirms the reboot band, not replacement.
        (0.4, (("slow_node", 600),), "slow_node", RepairAction.REBOOT),
        (None, (), "slow_node", RepairAction.NONE),
        (None, (("slow_node", 600),), "slow_node", RepairAction.REBOOT),
    ],
)
def test_slow_speed_check(
    ratio: float | None,
    history: tuple[tuple[str, float], ...],
    mode: str,
    action: RepairAction,
) -> None:
    details = {} if ratio is None else {"ratio_to_baseline": ratio}
    records = tuple(seen(m, ago) for m, ago in history)
    d = diagnose(cond("SlowSpeedCheck", **details), history=records)
    assert (d.failure_mode, d.action) == (mode, action)


def test_heartbeat_lost_reboots() -> None:
    d = diagnose(cond("HeartbeatLost", silent_for_s=120.0))
    assert (d.failure_mode, d.severity, d.action) == (
        "heartbeat_lost",
        Severity.CRITICAL,
        RepairAction.REBOOT,
    )


def test_unknown_condition_type_is_reported_not_acted_on() -> None:
    d = diagnose(cond("NvlinkDown"))
    assert (d.failure_mode, d.severity, d.action) == (
        "unmapped_condition",
        Severity.WARNING,
        RepairAction.NONE,
    )
    assert "NvlinkDown" in d.reasons[0]


# --- healthy, unknown ---------------------------------------------------------------------------


def test_all_false_is_healthy_ok() -> None:
    d = diagnose(cond("XidError", "false"), cond("DiskPressure", "false", used_fraction=0.99))
    assert (d.failure_mode, d.severity, d.action) == ("healthy", Severity.OK, RepairAction.NONE)
    assert d.healthy
    assert d.reasons == ()


def test_all_unknown_is_unknown_not_healthy() -> None:
    d = diagnose(cond("DcgmDiagFailed", "unknown"), cond("SlowSpeedCheck", "unknown"))
    assert (d.failure_mode, d.severity, d.action) == (
        "unknown",
        Severity.WARNING,
        RepairAction.NONE,
    )
    assert d.unknown_checks == ("DcgmDiagFailed", "SlowSpeedCheck")
    assert not d.healthy


def test_empty_report_is_unknown() -> None:
    d = diagnose()
    assert d.failure_mode == "unknown"
    assert not d.healthy


def test_unknown_alongside_passes_is_healthy_but_noted() -> None:
    d = diagnose(cond("DiskPressure", "false"), cond("DcgmDiagFailed", "unknown"))
    assert d.failure_mode == "healthy"
    assert d.severity is Severity.INFO
    assert d.healthy
    assert d.unknown_checks == ("DcgmDiagFailed",)
    assert any("DcgmDiagFailed" in r for r in d.reasons)


def test_unknown_alongside_a_problem_does_not_soften_it() -> None:
    d = diagnose(xid(79), cond("DcgmDiagFailed", "unknown"))
    assert d.action is RepairAction.REBOOT
    assert d.unknown_checks == ("DcgmDiagFailed",)


def test_unknown_ignores_its_details() -> None:
    d = diagnose(cond("XidError", "unknown", xids=[79]), cond("DiskPressure", "false"))
    assert d.action is RepairAction.NONE


# --- combination ---------------------------------------------------------------------------------


def test_worst_action_and_worst_severity_win_and_every_finding_is_listed() -> None:
    d = diagnose(
        xid(13),
        cond("DiskPressure", used_fraction=0.99),
        cond("ThermalThrottling", temperature_c=80.0),
    )
    assert d.action is RepairAction.REIMAGE
    assert d.severity is Severity.CRITICAL
    assert d.failure_mode == "disk_full"
    assert len(d.reasons) == 3
    assert "disk_full" in d.reasons[0]  # worst first


def test_severity_is_worst_even_when_it_comes_with_no_action() -> None:
    d = diagnose(xid(43), cond("ThermalThrottling", temperature_c=80.0))
    assert (d.failure_mode, d.severity, d.action) == (
        "thermal_throttling",
        Severity.WARNING,
        RepairAction.NONE,
    )


def test_worst_severity_comes_from_a_different_finding_than_the_action() -> None:
    # A confirmed straggler asks for a reboot (warning); XID 48 asks for a reset (critical).
    d = diagnose(
        cond("SlowSpeedCheck", ratio_to_baseline=0.7),
        xid(48),
        history=(seen("slow_node", 600),),
    )
    assert d.action is RepairAction.REBOOT
    assert d.failure_mode == "slow_node"
    assert d.severity is Severity.CRITICAL


def test_replace_outranks_manual_and_manual_outranks_reimage() -> None:
    assert diagnose(xid(54), cond("RowRemapFailure", failure=True)).action is RepairAction.REPLACE
    d = diagnose(xid(54), cond("DiskPressure", used_fraction=0.99))
    assert d.action is RepairAction.MANUAL
    assert d.failure_mode == "aux_power_or_mechanical"


# --- sightings for confirmation ------------------------------------------------------------------


def test_unconfirmed_sightings_are_returned_for_recording() -> None:
    r = report(cond("SlowSpeedCheck", ratio_to_baseline=0.7), xid(13))
    records = unconfirmed_sightings(r, [], NOW, TABLE)
    assert records == (FailureRecord(NOW, "slow_node", RepairAction.NONE),)
    # Recorded, the next slow check is confirmed.
    later = NOW + 60
    d = triage(report(cond("SlowSpeedCheck", ratio_to_baseline=0.7)), list(records), later, TABLE)
    assert d.action is RepairAction.REBOOT


def test_confirmed_or_acting_findings_are_not_sightings() -> None:
    slow = report(cond("SlowSpeedCheck", ratio_to_baseline=0.7))
    assert unconfirmed_sightings(slow, [seen("slow_node", 60)], NOW, TABLE) == ()
    # DCGM level 3 unconfirmed still reboots: the repair service records that one.
    dcgm = report(cond("DcgmDiagFailed", level=3))
    assert unconfirmed_sightings(dcgm, [], NOW, TABLE) == ()
    assert unconfirmed_sightings(report(xid(79)), [], NOW, TABLE) == ()


# --- properties ----------------------------------------------------------------------------------

_POOL: list[Condition] = [
    xid(79),
    xid(13),
    xid(43),
    xid(999),
    xid(54),
    xid(48, 74),
    cond("EccUncorrectable", volatile_dbe=1),
    cond("RowRemapFailure", pending=True),
    cond("DcgmDiagFailed", level=2),
    cond("ThermalThrottling", temperature_c=80.0),
    cond("DiskPressure", used_fraction=0.99),
    cond("DiskPressure", used_fraction=0.92),
    cond("SlowSpeedCheck", ratio_to_baseline=0.7),
    cond("HeartbeatLost"),
    cond("NvlinkDown"),
    cond("DiskPressure", "false"),
    cond("DcgmDiagFailed", "unknown"),
    cond("SlowSpeedCheck", "unknown"),
]
_HISTORY = [seen("slow_node", 120), seen("gpu_fell_off_bus", 3000, RepairAction.REBOOT)]


@given(
    st.lists(st.sampled_from(_POOL), max_size=8).flatmap(
        lambda xs: st.tuples(st.just(xs), st.permutations(xs))
    )
)
def test_triage_is_order_independent(pair: tuple[list[Condition], list[Condition]]) -> None:
    conditions, shuffled = pair
    a = triage(report(*conditions), _HISTORY, NOW, TABLE)
    b = triage(report(*shuffled), list(reversed(_HISTORY)), NOW, TABLE)
    assert a == b


@given(st.lists(st.sampled_from(_POOL), min_size=1, max_size=8))
def test_combined_action_is_the_worst_single_action(conditions: list[Condition]) -> None:
    combined = triage(report(*conditions), _HISTORY, NOW, TABLE)
    singles = [triage(report(c), _HISTORY, NOW, TABLE) for c in conditions]
    if all(s.failure_mode == "unknown" for s in singles):
        assert combined.failure_mode == "unknown"
        return
    assert combined.action is worst_action(s.action for s in singles)
    assert set(combined.unknown_checks) == {u for s in singles for u in s.unknown_checks}


def _reference(r: Any) -> tuple[Diagnosis, tuple[FailureRecord, ...]]:
    """triage and unconfirmed_sightings as two full passes over the findings (no fast path)."""
    from shared.domain.health import ConditionStatus
    from shared.policies import triage as t

    unknown = tuple(sorted({c.type for c in r.conditions if c.status == ConditionStatus.UNKNOWN}))
    if all(c.status == ConditionStatus.UNKNOWN for c in r.conditions):
        return t._nothing_checked(unknown), ()
    findings, unmapped = t._findings(r, _HISTORY, NOW, TABLE)
    return t._combine(findings, unmapped, unknown), unconfirmed_sightings(r, _HISTORY, NOW, TABLE)


@given(st.lists(st.sampled_from(_POOL), max_size=8))
def test_diagnose_is_triage_and_sightings_in_one_pass(conditions: list[Condition]) -> None:
    """The triage service's one call (with its shortcuts for reports with nothing true)
    gives what the two full passes give, for every mix of conditions."""
    from shared.policies.triage import diagnose as both

    r = report(*conditions)
    assert both(r, _HISTORY, NOW, TABLE) == _reference(r)
