"""Triage: one health report (+ the node's history) -> one diagnosis. Pure and table-driven.

Every TRUE condition becomes one or more findings; the diagnosis takes the worst action and
the worst severity among them and lists every finding in ``reasons``, worst first. The result
does not depend on the order of the report's conditions.

Rules that must hold (they are what peers got wrong):
- UNKNOWN checks never make a node healthy or sick; if nothing could be checked the diagnosis
  is ``unknown`` (WARNING, NONE). A report with no conditions at all counts as nothing checked.
- XIDs the table does not know get the table's explicit default and are listed in
  ``unmapped_xids``; they never fall through silently.
- A lone XID 45 is benign; with other XIDs, triage acts on the others.
- Noisy signals (slow speed check, thermal, long DCGM levels) act only once confirmed by
  earlier sightings in ``history`` (FailureRecords with a matching failure_mode, any action,
  strictly before ``now``). Callers must therefore record unconfirmed sightings too:
  :func:`unconfirmed_sightings` gives the records to append.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.domain.health import (
    Condition,
    ConditionStatus,
    ConditionType,
    Diagnosis,
    FailureRecord,
    HealthReport,
    RepairAction,
    Severity,
)
from shared.policies.ranking import action_rank, severity_rank, worst_severity
from shared.policies.triage_table import (
    ConditionRule,
    Confirmation,
    FlagsRule,
    NumericRule,
    Outcome,
    TriageTable,
    load_triage_table,
    lookup_key,
    normalise_recovery_action,
)

__all__ = [
    "ALL_PASSED",
    "HEALTHY",
    "UNKNOWN",
    "TriageTable",
    "diagnose",
    "load_triage_table",
    "triage",
    "unconfirmed_sightings",
]

HEALTHY = "healthy"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class _Finding:
    failure_mode: str
    severity: Severity
    action: RepairAction
    reason: str
    unconfirmed: bool = False  # waiting for earlier sightings before it acts

    def sort_key(self) -> tuple[int, int, str, str]:
        return (
            action_rank(self.action),
            severity_rank(self.severity),
            self.failure_mode,
            self.reason,
        )


def triage(
    report: HealthReport,
    history: Sequence[FailureRecord],
    now: float,
    table: TriageTable,
) -> Diagnosis:
    """Diagnose ``report`` for its node, given that node's earlier failures."""
    return diagnose(report, history, now, table)[0]


def unconfirmed_sightings(
    report: HealthReport,
    history: Sequence[FailureRecord],
    now: float,
    table: TriageTable,
) -> tuple[FailureRecord, ...]:
    """Records to append to the node's history so that confirmation rules can fire later.

    One FailureRecord(now, failure_mode, NONE) per finding that waits for confirmation and
    does nothing meanwhile. Nobody else records those (the repair service only records what it
    acts on), and without them a repeated slow speed check would never be confirmed. Action
    NONE keeps them out of the repair ladder and the lemon count.
    """
    findings, _ = _findings(report, history, now, table)
    return _waiting(findings, now)


def diagnose(
    report: HealthReport,
    history: Sequence[FailureRecord],
    now: float,
    table: TriageTable,
) -> tuple[Diagnosis, tuple[FailureRecord, ...]]:
    """:func:`triage` and :func:`unconfirmed_sightings` of one report from one pass over its
    findings (the triage service needs both for every report)."""
    unknown = _UNKNOWN
    statuses = {c[1] for c in report.conditions}  # (the status of each: a set, one pass)
    something_true = _TRUE in statuses
    if not something_true and unknown not in statuses:
        # a report in which every check ran and passed: the most common one, by far
        return (_ALL_PASSED if statuses else _NOTHING_CHECKED), ()
    unknown_checks = tuple(sorted({c.type for c in report.conditions if c.status == unknown}))
    if statuses == {unknown}:
        return _nothing_checked(unknown_checks), ()
    if not something_true:  # some checks could not run, the others passed: no findings
        return _combine((), (), unknown_checks), ()
    findings, unmapped = _findings(report, history, now, table)
    return _combine(findings, unmapped, unknown_checks), _waiting(findings, now)


def _nothing_checked(unknown_checks: tuple[str, ...]) -> Diagnosis:
    what = ", ".join(unknown_checks) if unknown_checks else "no conditions reported"
    return Diagnosis(
        failure_mode=UNKNOWN,
        severity=Severity.WARNING,
        action=RepairAction.NONE,
        reasons=(f"nothing could be checked: {what}",),
        unknown_checks=unknown_checks,
    )


def _waiting(findings: Iterable[_Finding], now: float) -> tuple[FailureRecord, ...]:
    modes = sorted(
        {f.failure_mode for f in findings if f.unconfirmed and f.action is RepairAction.NONE}
    )
    return tuple(FailureRecord(now, mode, RepairAction.NONE) for mode in modes)


def _findings(
    report: HealthReport,
    history: Sequence[FailureRecord],
    now: float,
    table: TriageTable,
) -> tuple[set[_Finding], set[int]]:
    present = [c for c in report.conditions if c.status == ConditionStatus.TRUE]
    findings: set[_Finding] = set()
    unmapped: set[int] = set()

    xid_conditions = [c for c in present if c.type == ConditionType.XID_ERROR.value]
    all_codes = {code for c in xid_conditions for code in _xid_codes(c.details)}
    for condition in xid_conditions:
        found, missing = _xid_findings(condition, all_codes, history, now, table)
        findings.update(found)
        unmapped.update(missing)

    for condition in present:
        if condition.type == ConditionType.XID_ERROR.value:
            continue
        rule = table.conditions.get(condition.type)
        if rule is None:
            reason = f"{condition.type}: not in triage table v{table.version}"
            findings.add(_resolve(table.unmapped_condition, reason, history, now))
        else:
            findings.add(_condition_finding(condition, rule, history, now))
    return findings, unmapped


def _combine(
    findings: Iterable[_Finding], unmapped: Iterable[int], unknown_checks: tuple[str, ...]
) -> Diagnosis:
    ordered = sorted(findings, key=_Finding.sort_key, reverse=True)
    notes = (f"could not check: {', '.join(unknown_checks)}",) if unknown_checks else ()
    if not ordered:
        return Diagnosis(
            failure_mode=HEALTHY,
            # Partly unchecked is still healthy (the checks that ran passed), but not "ok".
            severity=Severity.INFO if unknown_checks else Severity.OK,
            action=RepairAction.NONE,
            reasons=notes,
            unknown_checks=unknown_checks,
        )
    worst = ordered[0]
    severity = worst_severity(f.severity for f in ordered)
    benign = worst.action is RepairAction.NONE and severity_rank(severity) <= severity_rank(
        Severity.INFO
    )
    return Diagnosis(
        failure_mode=HEALTHY if benign else worst.failure_mode,
        severity=severity,
        action=worst.action,
        reasons=tuple(f.reason for f in ordered) + notes,
        unmapped_xids=tuple(sorted(set(unmapped))),
        unknown_checks=unknown_checks,
    )


# the two diagnoses of a report without findings that need no work per report (frozen values)
_TRUE, _UNKNOWN = ConditionStatus.TRUE, ConditionStatus.UNKNOWN
_ALL_PASSED = _combine((), (), ())
ALL_PASSED = _ALL_PASSED  # what ``diagnose`` answers, this very object, when every check passed
_NOTHING_CHECKED = _nothing_checked(())


# --- XIDs ------------------------------------------------------------------------------------


def _xid_codes(details: Mapping[str, Any]) -> list[int]:
    raw = details.get("xids")
    if not isinstance(raw, list | tuple):
        return []
    codes: list[int] = []
    for item in raw:
        if isinstance(item, bool):
            continue
        if isinstance(item, int):
            codes.append(item)
        elif isinstance(item, str) and item.strip().isdigit():
            codes.append(int(item.strip()))
    return codes


def _xid_findings(
    condition: Condition,
    all_codes: set[int],
    history: Sequence[FailureRecord],
    now: float,
    table: TriageTable,
) -> tuple[list[_Finding], list[int]]:
    codes = sorted(set(_xid_codes(condition.details)))
    if not codes:
        reason = "XidError reported without readable XID codes"
        return [_resolve(table.unmapped_xid, reason, history, now)], []

    has_primary = any(code not in table.defer_when_co_occurring for code in all_codes)
    findings: list[_Finding] = []
    unmapped: list[int] = []
    for code in codes:
        if code in table.defer_when_co_occurring and has_primary:
            continue  # e.g. XID 45 cleaning up after another XID: act on that one
        outcome = table.xid_rule(code)
        if outcome is None:
            unmapped.append(code)
            reason = f"XID {code} (not in triage table v{table.version}, default applies)"
            findings.append(_resolve(table.unmapped_xid, reason, history, now))
            continue
        reason = f"XID {code}"
        if code in table.recovery_action_codes:
            outcome, reason = _recovery_override(outcome, reason, condition.details, table)
        findings.append(_resolve(outcome, reason, history, now))
    return findings, unmapped


def _recovery_override(
    outcome: Outcome, reason: str, details: Mapping[str, Any], table: TriageTable
) -> tuple[Outcome, str]:
    """XID 154 names its own recovery action; use it when the table knows the name."""
    named = details.get("recovery_action")
    if not isinstance(named, str) or not named.strip():
        return outcome, f"{reason} (no recovery action named)"
    action = table.recovery_actions.get(normalise_recovery_action(named))
    if action is None:
        return outcome, f"{reason} (unrecognised recovery action {named!r})"
    severity = Severity.INFO if action is RepairAction.NONE else outcome.severity
    return (
        replace(outcome, action=action, severity=severity),
        f"{reason} (driver asks for {normalise_recovery_action(named)})",
    )


# --- other conditions ------------------------------------------------------------------------


def _condition_finding(
    condition: Condition,
    rule: ConditionRule,
    history: Sequence[FailureRecord],
    now: float,
) -> _Finding:
    ctype = condition.type
    details = condition.details
    if isinstance(rule, NumericRule):
        value = _as_number(details.get(rule.field))
        if value is None:
            return _resolve(rule.missing, f"{ctype}: {rule.field} not reported", history, now)
        reason = f"{ctype}: {rule.field}={value:g}"
        matching = [tier.outcome for tier in rule.tiers if tier.matches(value)]
        for outcome in matching:
            if _is_confirmed(outcome.confirm, history, now):
                return _resolve(outcome, reason, history, now)
        if matching:
            return _resolve(matching[0], reason, history, now)
        return _resolve(rule.otherwise, reason, history, now)
    if isinstance(rule, FlagsRule):
        for flag, outcome in rule.flags:
            if details.get(flag) is True:
                return _resolve(outcome, f"{ctype}: {flag}", history, now)
        return _resolve(rule.otherwise, f"{ctype}: no flag set", history, now)
    raw = details.get(rule.field)
    if raw is None or isinstance(raw, bool):
        return _resolve(rule.missing, f"{ctype}: {rule.field} not reported", history, now)
    key = lookup_key(raw)
    reason = f"{ctype}: {rule.field}={key}"
    return _resolve(rule.values.get(key, rule.otherwise), reason, history, now)


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# --- confirmation ----------------------------------------------------------------------------


def _sightings(confirm: Confirmation, history: Sequence[FailureRecord], now: float) -> int:
    """Earlier sightings within the window; the current one is not in ``history``."""
    start = now - confirm.window_s
    return sum(1 for r in history if start <= r.at < now and r.failure_mode in confirm.counts_modes)


def _is_confirmed(
    confirm: Confirmation | None, history: Sequence[FailureRecord], now: float
) -> bool:
    return confirm is None or _sightings(confirm, history, now) + 1 >= confirm.count


def _resolve(
    outcome: Outcome, reason: str, history: Sequence[FailureRecord], now: float
) -> _Finding:
    """Turn a rule's outcome into a finding, applying its confirmation rule."""
    confirm = outcome.confirm
    text = f"{reason} -> {outcome.failure_mode}"
    if confirm is None:
        return _Finding(
            outcome.failure_mode, outcome.severity, outcome.action, f"{text}: {outcome.action}"
        )
    seen = _sightings(confirm, history, now) + 1
    window = f"{confirm.window_s:g}s"
    if seen >= confirm.count:
        return _Finding(
            outcome.failure_mode,
            outcome.severity,
            outcome.action,
            f"{text}: {outcome.action} (confirmed, {seen} sightings within {window})",
        )
    return _Finding(
        outcome.failure_mode,
        confirm.unconfirmed_severity,
        confirm.unconfirmed_action,
        f"{text}: {confirm.unconfirmed_action} (unconfirmed, sighting {seen} of "
        f"{confirm.count} within {window}; would {outcome.action})",
        unconfirmed=True,
    )
