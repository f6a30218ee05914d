"""A cluster's policy rollout as data: the candidate triage table and its stages, and a
candidate repair configuration (in shadow only).

The document (what the API's ``triagePolicy:configure`` takes and the store keeps)::

    {"candidate": {...a triage table, shared/policies/triage_table.py format...},
     "repair": {...RepairConfig fields, as shared.policies.repair.load_repair_config reads...},
     "stages": [{"stage": "recommend", "cause": "nvlink_error", "partition": "train"}, ...],
     "defaultStage": "shadow", "recommendTimeoutS": 3600, "timeoutDefault": "dismiss"}

One of ``candidate`` and ``repair`` may be absent. ``candidate`` is validated as strictly
as the packaged table (a typo fails, naming its key),
so an operator-defined action for an error code is one validated row of it. ``stages`` rows
name a cause (a failure mode, or ``*``) and a partition (or ``*``); see
:func:`shared.policies.shadow.stage_for`. Also here: the stored form of a diff report and of
a recommendation (plain dicts, JSON-safe), and back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.domain import validation as kit
from shared.domain.errors import ValidationError
from shared.domain.health import RepairAction
from shared.policies.repair import RepairConfig, load_repair_config
from shared.policies.shadow import (
    ANY,
    CauseRow,
    Decision,
    DiffReport,
    Divergence,
    Recommendation,
    Stage,
    StageRule,
    TimeoutDefault,
    Verdict,
)
from shared.policies.triage_table import TriageTable, parse_triage_table

MAX_STAGE_ROWS = 256
MAX_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_TIMEOUT_S = 3600.0
_E = TypeVar("_E", Stage, TimeoutDefault)
_KEYS = {"candidate", "repair", "stages", "defaultStage", "recommendTimeoutS", "timeoutDefault",
         "reason"}
ROLLOUT_KEYS = frozenset(_KEYS - {"reason"})  # what a stored document holds of the rollout


@dataclass(frozen=True)
class Rollout:
    candidate: TriageTable | None  # None: triage runs the active table alone
    doc: Mapping[str, Any]  # the validated document, as stored
    rules: tuple[StageRule, ...] = ()
    default_stage: Stage = Stage.SHADOW
    recommend_timeout_s: float = DEFAULT_TIMEOUT_S
    timeout_default: TimeoutDefault = TimeoutDefault.DISMISS
    repair: RepairConfig | None = None  # a candidate repair configuration, in shadow


def parse_rollout(data: Any) -> Rollout:
    """Validate a rollout document; errors name the key (``candidate.xid.rules[3].action``)."""
    top = kit.mapping(data, "")
    kit.only_keys(top, "", _KEYS)
    candidate_raw, repair_raw = top.get("candidate"), top.get("repair")
    if candidate_raw is None and repair_raw is None:
        raise ValidationError("candidate", "is required (a triage table), unless a candidate "
                              "repair configuration is given")
    try:
        candidate = None if candidate_raw is None else parse_triage_table(candidate_raw)
    except ValidationError as exc:
        raise exc.nested("candidate") from exc
    try:
        repair = None if repair_raw is None else load_repair_config(repair_raw)
    except ValidationError as exc:
        raise exc.nested("repair") from exc
    rows = top.get("stages", [])
    if not isinstance(rows, list):
        raise ValidationError("stages", "must be a list")
    if len(rows) > MAX_STAGE_ROWS:
        raise ValidationError("stages", f"at most {MAX_STAGE_ROWS} rows")
    rules = tuple(_stage_rule(row, kit.join("stages", i)) for i, row in enumerate(rows))
    seen: set[tuple[str, str]] = set()
    for i, rule in enumerate(rules):
        if (rule.cause, rule.partition) in seen:
            raise ValidationError(kit.join("stages", i), f"cause {rule.cause!r} on partition "
                                  f"{rule.partition!r} is already staged")
        seen.add((rule.cause, rule.partition))
    timeout = kit.number(top.get("recommendTimeoutS", DEFAULT_TIMEOUT_S), "recommendTimeoutS",
                         low=1.0, high=MAX_TIMEOUT_S)
    default_stage = _enum(Stage, top.get("defaultStage", "shadow"), "defaultStage")
    timeout_default = _enum(TimeoutDefault, top.get("timeoutDefault", "dismiss"),
                            "timeoutDefault")
    doc = {"candidate": candidate_raw, "repair": repair_raw,
           "stages": [{"stage": r.stage.value, "cause": r.cause, "partition": r.partition}
                      for r in rules],
           "defaultStage": default_stage.value, "recommendTimeoutS": timeout,
           "timeoutDefault": timeout_default.value}
    return Rollout(candidate, doc, rules, default_stage, timeout, timeout_default, repair)


def digest(doc: Mapping[str, Any]) -> str:
    """A validated document's fingerprint: stored beside it, so a reader can tell the
    rollout it already parsed without serialising the candidate table again."""
    text = json.dumps({k: doc[k] for k in sorted(doc) if k in _KEYS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _enum(cls: type[_E], value: Any, path: str) -> _E:
    try:
        return cls(str(value).lower())
    except ValueError:
        raise ValidationError(path, f"must be one of {[m.value for m in cls]}, "
                              f"got {value!r}") from None


def _stage_rule(value: Any, path: str) -> StageRule:
    row = kit.mapping(value, path)
    kit.only_keys(row, path, {"stage", "cause", "partition"})
    stage = _enum(Stage, kit.required(row, "stage", path), kit.join(path, "stage"))
    cause = kit.text(row.get("cause", ANY), kit.join(path, "cause"))
    partition = kit.text(row.get("partition", ANY), kit.join(path, "partition"))
    return StageRule(stage, cause, partition)


# --- stored forms ----------------------------------------------------------------------------


MODE, STEP = "failureMode", "step"  # a triage decision's first field; a repair step's


def _decision_doc(d: Decision, first: str = MODE) -> dict[str, str]:
    return {first: d.failure_mode, "action": d.action.value}


def _decision(doc: Mapping[str, Any]) -> Decision:
    return Decision(str(doc[MODE] if MODE in doc else doc[STEP]), RepairAction(doc["action"]))


def report_doc(report: DiffReport, first: str = MODE) -> dict[str, Any]:
    """The stored form; ``first``: what a decision's first field is called (``step`` in a
    repair configuration's report, whose decisions are repair steps)."""
    return {"evaluated": report.evaluated, "differing": report.differing,
            "dropped": report.dropped, "causes": list(report.causes),
            "rows": [{"cause": r.cause, "active": _decision_doc(r.active, first),
                      "candidate": _decision_doc(r.candidate, first), "count": r.count,
                      "firstAt": r.first_at, "lastAt": r.last_at, "nodes": list(r.nodes)}
                     for r in report.rows]}


def report_of(doc: Mapping[str, Any] | None) -> DiffReport:
    if not doc:
        return DiffReport()
    rows = tuple(CauseRow(str(r["cause"]), _decision(r["active"]), _decision(r["candidate"]),
                          int(r["count"]), float(r["firstAt"]), float(r["lastAt"]),
                          tuple(r.get("nodes", ()))) for r in doc.get("rows", ()))
    return DiffReport(int(doc.get("evaluated", 0)), int(doc.get("differing", 0)), rows,
                      int(doc.get("dropped", 0)))


def recommendation_doc(rec: Recommendation) -> dict[str, Any]:
    d = rec.divergence
    return {"id": rec.rec_id, "nodeId": rec.node_id, "cause": d.cause, "at": d.at,
            "active": _decision_doc(d.active), "candidate": _decision_doc(d.candidate),
            "createdAt": rec.created_at, "deadline": rec.deadline, "verdict": rec.verdict.value,
            "decidedAt": rec.decided_at, "by": rec.by, "reason": rec.reason}


def recommendation_of(doc: Mapping[str, Any]) -> Recommendation:
    divergence = Divergence(str(doc["nodeId"]), float(doc["at"]), _decision(doc["active"]),
                            _decision(doc["candidate"]))
    decided = doc.get("decidedAt")
    return Recommendation(str(doc["id"]), str(doc["nodeId"]), divergence,
                          float(doc["createdAt"]), float(doc["deadline"]),
                          Verdict(doc["verdict"]), None if decided is None else float(decided),
                          str(doc.get("by", "")), str(doc.get("reason", "")))
