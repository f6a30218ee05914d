"""The triage table: versioned data mapping health signals to failure mode, severity, action.

Kept as data (``data/triage_table.v1.yaml``) so the XID classes and thresholds can change
without code changes, and validated strictly on load so a typo fails loudly, naming its key,
instead of silently falling through to a default at 3 a.m.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from shared import yaml_text
from shared.domain import validation as kit
from shared.domain.errors import ValidationError
from shared.domain.health import ConditionType, RepairAction, Severity
from shared.policies.ranking import action_rank

SUPPORTED_VERSIONS = frozenset({1})
DEFAULT_TABLE_PATH = Path(__file__).parent / "data" / "triage_table.v1.yaml"
RESERVED_FAILURE_MODES = frozenset({"healthy", "unknown"})  # Diagnosis-level labels

_FAILURE_MODE_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_RANGE_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


@dataclass(frozen=True)
class Confirmation:
    """Act only after ``count`` sightings (this one included) within ``window_s``.

    A sighting is an earlier FailureRecord whose failure_mode is in ``counts_modes``; until the
    count is reached the finding reports the ``unconfirmed_*`` severity and action instead.
    """

    count: int
    window_s: float
    counts_modes: frozenset[str]
    unconfirmed_severity: Severity
    unconfirmed_action: RepairAction


@dataclass(frozen=True)
class Outcome:
    """What one rule concludes."""

    failure_mode: str
    severity: Severity
    action: RepairAction
    confirm: Confirmation | None = None


@dataclass(frozen=True)
class Tier:
    """A numeric band: matches ``at_least <= value < below`` (either bound may be absent)."""

    outcome: Outcome
    at_least: float | None = None
    below: float | None = None

    def matches(self, value: float) -> bool:
        if self.at_least is not None and value < self.at_least:
            return False
        return not (self.below is not None and value >= self.below)


@dataclass(frozen=True)
class NumericRule:
    """details[field] against ordered tiers."""

    field: str
    tiers: tuple[Tier, ...]
    otherwise: Outcome
    missing: Outcome


@dataclass(frozen=True)
class FlagsRule:
    """The first boolean details flag that is set decides."""

    flags: tuple[tuple[str, Outcome], ...]
    otherwise: Outcome


@dataclass(frozen=True)
class LookupRule:
    """details[field] (normalised to a string) looked up in ``values``."""

    field: str
    values: Mapping[str, Outcome]
    otherwise: Outcome
    missing: Outcome


ConditionRule = NumericRule | FlagsRule | LookupRule


@dataclass(frozen=True)
class TriageTable:
    """A validated triage table. Mappings are read-only views; the table is not hashable."""

    version: int
    xid_rules: Mapping[int, Outcome]
    unmapped_xid: Outcome
    defer_when_co_occurring: frozenset[int]
    recovery_action_codes: frozenset[int]
    recovery_actions: Mapping[str, RepairAction]
    conditions: Mapping[str, ConditionRule]
    unmapped_condition: Outcome

    def xid_rule(self, code: int) -> Outcome | None:
        return self.xid_rules.get(code)


def load_triage_table(path: Path | None = None) -> TriageTable:
    """Read and validate a triage table; the packaged v1 table (read once) by default."""
    if path is None:
        return _load_default()
    return _load_file(path)


@functools.cache
def _load_default() -> TriageTable:
    return _load_file(DEFAULT_TABLE_PATH)


def _load_file(path: Path) -> TriageTable:
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml_text.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValidationError(str(path), f"not valid YAML: {exc}") from exc
    return parse_triage_table(data)


def parse_triage_table(data: Any) -> TriageTable:
    """Validate an already-parsed table (e.g. from a config store); errors name the key."""
    top = kit.mapping(data, "")
    kit.only_keys(top, "", {"version", "xid", "conditions", "unmapped_condition"})
    version = kit.integer(top.get("version"), "version")
    if version not in SUPPORTED_VERSIONS:
        raise ValidationError(
            "version",
            f"unsupported version {version}; this code reads {sorted(SUPPORTED_VERSIONS)}",
        )
    xid = kit.mapping(kit.required(top, "xid", ""), "xid")
    kit.only_keys(
        xid,
        "xid",
        {
            "unmapped",
            "defer_when_co_occurring",
            "recovery_action_codes",
            "recovery_actions",
            "rules",
        },
    )
    xid_rules = _parse_xid_rules(kit.required(xid, "rules", "xid"), "xid.rules")
    defer = _code_set(xid.get("defer_when_co_occurring", []), "xid.defer_when_co_occurring")
    recovery_codes = _code_set(xid.get("recovery_action_codes", []), "xid.recovery_action_codes")
    for key, codes in (
        ("xid.defer_when_co_occurring", defer),
        ("xid.recovery_action_codes", recovery_codes),
    ):
        for code in sorted(codes):
            if code not in xid_rules:
                raise ValidationError(key, f"code {code} needs its own row in xid.rules")
    recovery_actions = kit.mapping(xid.get("recovery_actions", {}), "xid.recovery_actions")
    return TriageTable(
        version=version,
        xid_rules=MappingProxyType(xid_rules),
        unmapped_xid=_parse_outcome(kit.required(xid, "unmapped", "xid"), "xid.unmapped"),
        defer_when_co_occurring=defer,
        recovery_action_codes=recovery_codes,
        recovery_actions=MappingProxyType(
            {
                normalise_recovery_action(str(name)): _action(value, f"xid.recovery_actions.{name}")
                for name, value in recovery_actions.items()
            }
        ),
        conditions=MappingProxyType(
            _parse_conditions(kit.required(top, "conditions", ""), "conditions")
        ),
        unmapped_condition=_parse_outcome(
            kit.required(top, "unmapped_condition", ""), "unmapped_condition"
        ),
    )


def normalise_recovery_action(name: str) -> str:
    """'Drain and Reset' / 'drain-and-reset' / 'DRAIN_AND_RESET' -> 'drain_and_reset'."""
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


# --- parsing helpers -------------------------------------------------------------------------


def _severity(value: Any, path: str) -> Severity:
    try:
        return Severity(str(value).lower())
    except ValueError as exc:
        choices = [s.value for s in Severity]
        raise ValidationError(path, f"unknown severity {value!r} (one of {choices})") from exc


def _action(value: Any, path: str) -> RepairAction:
    try:
        return RepairAction(str(value).lower())
    except ValueError as exc:
        choices = [a.value for a in RepairAction]
        raise ValidationError(path, f"unknown action {value!r} (one of {choices})") from exc


def _parse_outcome(value: Any, path: str) -> Outcome:
    data = kit.mapping(value, path)
    kit.only_keys(data, path, {"failure_mode", "severity", "action", "confirm"})
    mode = kit.required(data, "failure_mode", path)
    if not isinstance(mode, str) or not _FAILURE_MODE_RE.match(mode):
        raise ValidationError(kit.join(path, "failure_mode"), f"must be snake_case, got {mode!r}")
    if mode in RESERVED_FAILURE_MODES:
        raise ValidationError(kit.join(path, "failure_mode"), f"{mode!r} is reserved for diagnoses")
    severity = _severity(kit.required(data, "severity", path), kit.join(path, "severity"))
    action = _action(kit.required(data, "action", path), kit.join(path, "action"))
    confirm = None
    if data.get("confirm") is not None:
        confirm = _parse_confirm(data["confirm"], kit.join(path, "confirm"), mode, action)
    return Outcome(failure_mode=mode, severity=severity, action=action, confirm=confirm)


def _parse_confirm(value: Any, path: str, mode: str, action: RepairAction) -> Confirmation:
    data = kit.mapping(value, path)
    kit.only_keys(
        data,
        path,
        {"count", "window_s", "counts_modes", "unconfirmed_severity", "unconfirmed_action"},
    )
    count = kit.integer(kit.required(data, "count", path), kit.join(path, "count"), low=1)
    window = kit.number(kit.required(data, "window_s", path), kit.join(path, "window_s"),
                        finite=False)
    if window <= 0:
        raise ValidationError(kit.join(path, "window_s"), f"must be positive, got {window}")
    modes_raw = data.get("counts_modes", [mode])
    if not isinstance(modes_raw, list) or not all(isinstance(m, str) for m in modes_raw):
        raise ValidationError(kit.join(path, "counts_modes"), "must be a list of failure modes")
    if mode not in modes_raw:
        raise ValidationError(kit.join(path, "counts_modes"), f"must include its own mode {mode!r}")
    unconfirmed_action = _action(
        data.get("unconfirmed_action", "none"), kit.join(path, "unconfirmed_action")
    )
    if action_rank(unconfirmed_action) > action_rank(action):
        raise ValidationError(
            kit.join(path, "unconfirmed_action"), "must not be more disruptive than the confirmed action"
        )
    return Confirmation(
        count=count,
        window_s=window,
        counts_modes=frozenset(modes_raw),
        unconfirmed_severity=_severity(
            data.get("unconfirmed_severity", "warning"), kit.join(path, "unconfirmed_severity")
        ),
        unconfirmed_action=unconfirmed_action,
    )


def _expand_codes(value: Any, path: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ValidationError(path, "must be a non-empty list of codes or 'a-b' ranges")
    codes: list[int] = []
    for index, item in enumerate(value):
        item_path = kit.join(path, index)
        if isinstance(item, bool):
            raise ValidationError(item_path, f"must be a code or range, got {item!r}")
        if isinstance(item, int):
            if item < 0:
                raise ValidationError(item_path, f"must not be negative, got {item}")
            codes.append(item)
            continue
        match = _RANGE_RE.match(item) if isinstance(item, str) else None
        if match is None:
            raise ValidationError(item_path, f"must be a code or 'a-b' range, got {item!r}")
        low, high = int(match.group(1)), int(match.group(2))
        if low > high:
            raise ValidationError(item_path, f"range {item!r} runs backwards")
        codes.extend(range(low, high + 1))
    return codes


def _code_set(value: Any, path: str) -> frozenset[int]:
    if value == []:
        return frozenset()
    return frozenset(_expand_codes(value, path))


def _parse_xid_rules(value: Any, path: str) -> dict[int, Outcome]:
    if not isinstance(value, list) or not value:
        raise ValidationError(path, "must be a non-empty list of rules")
    rules: dict[int, Outcome] = {}
    owner: dict[int, str] = {}
    for index, raw in enumerate(value):
        row_path = kit.join(path, index)
        row = dict(kit.mapping(raw, row_path))
        codes = _expand_codes(kit.required(row, "codes", row_path), kit.join(row_path, "codes"))
        outcome = _parse_outcome({k: v for k, v in row.items() if k != "codes"}, row_path)
        for code in codes:
            if code in rules:
                raise ValidationError(
                    kit.join(row_path, "codes"), f"XID {code} is already mapped by {owner[code]}"
                )
            rules[code] = outcome
            owner[code] = row_path
    return rules


_NEEDS_RULE = tuple(t.value for t in ConditionType if t is not ConditionType.XID_ERROR)


def _parse_conditions(value: Any, path: str) -> dict[str, ConditionRule]:
    data = kit.mapping(value, path)
    kit.only_keys(data, path, set(_NEEDS_RULE))
    rules: dict[str, ConditionRule] = {}
    for ctype in _NEEDS_RULE:
        rules[ctype] = _parse_condition_rule(kit.required(data, ctype, path), f"{path}.{ctype}")
    return rules


def _parse_condition_rule(value: Any, path: str) -> ConditionRule:
    data = kit.mapping(value, path)
    kind = kit.required(data, "kind", path)
    if kind == "numeric":
        kit.only_keys(data, path, {"kind", "field", "tiers", "otherwise", "missing"})
        tiers_raw = data.get("tiers", [])
        if not isinstance(tiers_raw, list):
            raise ValidationError(kit.join(path, "tiers"), "must be a list")
        return NumericRule(
            field=_field(data, path),
            tiers=tuple(_parse_tier(t, f"{path}.tiers[{i}]") for i, t in enumerate(tiers_raw)),
            otherwise=_parse_outcome(kit.required(data, "otherwise", path), kit.join(path, "otherwise")),
            missing=_parse_outcome(kit.required(data, "missing", path), kit.join(path, "missing")),
        )
    if kind == "flags":
        kit.only_keys(data, path, {"kind", "flags", "otherwise"})
        flags = kit.mapping(kit.required(data, "flags", path), kit.join(path, "flags"))
        return FlagsRule(
            flags=tuple(
                (str(name), _parse_outcome(outcome, f"{path}.flags.{name}"))
                for name, outcome in flags.items()
            ),
            otherwise=_parse_outcome(kit.required(data, "otherwise", path), kit.join(path, "otherwise")),
        )
    if kind == "lookup":
        kit.only_keys(data, path, {"kind", "field", "values", "otherwise", "missing"})
        values = kit.mapping(kit.required(data, "values", path), kit.join(path, "values"))
        return LookupRule(
            field=_field(data, path),
            values=MappingProxyType(
                {
                    lookup_key(key): _parse_outcome(outcome, f"{path}.values.{key}")
                    for key, outcome in values.items()
                }
            ),
            otherwise=_parse_outcome(kit.required(data, "otherwise", path), kit.join(path, "otherwise")),
            missing=_parse_outcome(kit.required(data, "missing", path), kit.join(path, "missing")),
        )
    raise ValidationError(kit.join(path, "kind"), f"must be numeric, flags or lookup, got {kind!r}")


def _field(data: Mapping[str, Any], path: str) -> str:
    return kit.text(kit.required(data, "field", path), kit.join(path, "field"))


def _parse_tier(value: Any, path: str) -> Tier:
    data = dict(kit.mapping(value, path))
    at_least = data.pop("at_least", None)
    below = data.pop("below", None)
    if at_least is None and below is None:
        raise ValidationError(path, "needs at_least or below")
    low = None if at_least is None else kit.number(at_least, kit.join(path, "at_least"), finite=False)
    high = None if below is None else kit.number(below, kit.join(path, "below"), finite=False)
    if low is not None and high is not None and low >= high:
        raise ValidationError(path, f"empty band: at_least {low} >= below {high}")
    return Tier(outcome=_parse_outcome(data, path), at_least=low, below=high)


def lookup_key(value: Any) -> str:
    """Normalise a lookup value so YAML ``3``, JSON ``3.0`` and ``"3"`` all find the same row."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip().lower()
