"""A cluster's candidate triage table on live traffic: shadow, recommend-only, active; and
a candidate repair configuration, in shadow.

State in the store, beside the entities (plain records, in the caller's unit of work):

- ``triage_policies``: one document per cluster, the rollout (``shared.policies.triage_rollout``)
  with who set it and when; absent: no candidate, triage runs the active table alone;
- ``triage_shadow``: one document per cluster, the diff reports by cause (bounded rows):
  the triage table's (``triage``) and the repair configuration's (``repair``);
- ``triage_recommendations``: one document per recommendation (node, cause, candidate
  action), pending until an operator accepts or dismisses it or its deadline passes.
  At most ``MAX_PENDING`` pending and ``MAX_DECIDED`` decided ones per cluster.

:func:`triage` is what health triage calls instead of ``diagnose``: a report in which every
check passed or none could run is decided the same by any table, so only a report with a
finding reads the rollout. Accepting a recommendation emits ``NodeDiagnosed`` with the
candidate's decision, so it goes through the repair service as any diagnosis does (the
blast-radius guard included); a dismissal only records its reason. :func:`shadow_repair`
is what the repair service calls beside its own decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from shared.domain import lifecycle
from shared.domain.errors import Conflict, NotFound, ValidationError
from shared.domain.events import NodeDiagnosed, NodeOperatorActed
from shared.domain.health import (
    ConditionStatus,
    Diagnosis,
    FailureRecord,
    HealthReport,
    RepairAction,
)
from shared.domain.model import Node
from shared.handling import Deps
from shared.policies import shadow
from shared.policies import triage_rollout as ro
from shared.policies.repair_decision import RepairFacts, RepairStep
from shared.policies.triage import ALL_PASSED, diagnose
from shared.policies.triage_table import TriageTable
from shared.ports import UnitOfWork

POLICIES = "triage_policies"
SHADOW = "triage_shadow"
RECOMMENDATIONS = "triage_recommendations"
TRIAGE_REPORT, REPAIR_REPORT = "triage", "repair"  # the two diff reports of a cluster
MAX_PENDING = 200
MAX_DECIDED = 200
ACCEPT, DISMISS = "accept", "dismiss"
_MILD = (RepairAction.NONE, RepairAction.RESTART_JOB)
_TRUE = ConditionStatus.TRUE


def _records(uow: UnitOfWork) -> Any:
    return uow  # the document unit of work keeps plain records beside the entities


_PARSED: dict[str, ro.Rollout] = {}  # by digest: triage reads the rollout for every finding
_MAX_PARSED = 32


def rollout(uow: UnitOfWork, cluster_id: str) -> ro.Rollout | None:
    doc = _records(uow).record(POLICIES, cluster_id)
    if doc is None:
        return None
    key = doc.get("digest") or ro.digest(doc)
    found = _PARSED.get(key)
    if found is None:
        if len(_PARSED) >= _MAX_PARSED:
            _PARSED.pop(next(iter(_PARSED)))
        found = _PARSED[key] = ro.parse_rollout({k: v for k, v in doc.items()
                                                 if k in ro.ROLLOUT_KEYS})
    return found


def triage(node: Node, report: HealthReport, now: float, table: TriageTable,
           uow: UnitOfWork, *, new_fault: bool = True
           ) -> tuple[Diagnosis, tuple[FailureRecord, ...]]:
    """The diagnosis to apply to ``report`` and the sightings to record, the candidate's
    where its stage for the cause on the node's partition is active.

    A report that changed the node's conditions (``new_fault``) is counted in the cluster's
    diff report and, where they differ under recommend-only, becomes a recommendation; the
    same faults reported again are decided the same way and counted once, so a fault that
    lasts does not write the cluster's report on every report of it."""
    decided = diagnose(report, node.history, now, table)
    if decided[0] is ALL_PASSED or _TRUE not in {c[1] for c in report.conditions}:
        return decided  # nothing found: any table decides the same, no rollout is read
    policy = rollout(uow, node.cluster_id)
    if policy is None or policy.candidate is None:
        return decided
    compared = shadow.compare(report, node.history, now, table, policy.candidate, decided)
    records = _records(uow)
    if new_fault:
        _fold(records, node.cluster_id, TRIAGE_REPORT, compared.divergence)
    d = compared.divergence
    if d is None:
        return compared.active, compared.sightings
    stage = shadow.stage_for(policy.rules, d.cause, node.partition, policy.default_stage)
    if stage is shadow.Stage.ACTIVE:
        return compared.candidate, compared.candidate_sightings
    if stage is shadow.Stage.RECOMMEND and new_fault:
        _recommend(d, node.cluster_id, now, policy, records)
    return compared.active, compared.sightings


def shadow_repair(node: Node, facts: RepairFacts, step: RepairStep, now: float,
                  uow: UnitOfWork) -> None:
    """Where the cluster has a candidate repair configuration, the step it would take on the
    same facts, counted in the cluster's repair diff report; never applied. (A candidate
    that drains racks is weighed with the rack view only where the active configuration
    reads it too.)"""
    policy = rollout(uow, node.cluster_id)
    if policy is None or policy.repair is None:
        return
    _fold(_records(uow), node.cluster_id, REPAIR_REPORT,
          shadow.compare_repair(facts, now, step, policy.repair))


def _fold(records: Any, cluster_id: str, part: str, d: shadow.Divergence | None) -> None:
    doc = records.record(SHADOW, cluster_id) or {"cluster_id": cluster_id}
    folded = shadow.fold(ro.report_of(doc.get(part)), d)
    first = ro.STEP if part == REPAIR_REPORT else ro.MODE
    records.put_record(SHADOW, cluster_id, {**doc, part: ro.report_doc(folded, first)})


def _recommend(d: shadow.Divergence, cluster_id: str, now: float, policy: ro.Rollout,
               records: Any) -> None:
    rec_id = shadow.recommendation_id(d)
    doc_id = f"{cluster_id}:{rec_id}"
    existing = records.record(RECOMMENDATIONS, doc_id)
    if existing is not None and existing["verdict"] == shadow.Verdict.PENDING.value:
        return  # already waiting for an operator: its deadline stands
    pending = records.records(RECOMMENDATIONS, {"cluster_id": cluster_id,
                                                "verdict": shadow.Verdict.PENDING.value})
    if len(pending) >= MAX_PENDING:
        return  # the diff report still counts it; the queue stays bounded
    rec = shadow.Recommendation(rec_id, d.node_id, d, now, now + policy.recommend_timeout_s)
    records.put_record(RECOMMENDATIONS, doc_id,
                       {"cluster_id": cluster_id, **ro.recommendation_doc(rec)})


def recommendations(uow: UnitOfWork, cluster_id: str) -> list[dict[str, Any]]:
    docs = _records(uow).records(RECOMMENDATIONS, {"cluster_id": cluster_id})
    return sorted((_public(d) for d in docs), key=lambda d: (d["verdict"] != "pending",
                                                             -d["createdAt"], d["id"]))


def _public(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("_id", "cluster_id")}


def configure(uow: UnitOfWork, cluster_id: str, body: Any, by: str, now: float
              ) -> ro.Rollout:
    """Set (replace) the cluster's rollout; a new candidate starts a fresh diff report."""
    policy = ro.parse_rollout(body)
    records = _records(uow)
    before = records.record(POLICIES, cluster_id)
    if before is None or before.get("candidate") != policy.doc["candidate"] \
            or before.get("repair") != policy.doc["repair"]:
        empty = ro.report_doc(shadow.DiffReport())
        records.put_record(SHADOW, cluster_id, {"cluster_id": cluster_id,
                                                TRIAGE_REPORT: empty, REPAIR_REPORT: empty})
    records.put_record(POLICIES, cluster_id, {"cluster_id": cluster_id, **policy.doc,
                                              "digest": ro.digest(policy.doc),
                                              "by": by, "at": now})
    return policy


def clear(uow: UnitOfWork, cluster_id: str) -> None:
    records = _records(uow)
    for collection in (POLICIES, SHADOW):
        records.delete_record(collection, cluster_id)
    for doc in records.records(RECOMMENDATIONS, {"cluster_id": cluster_id}):
        records.delete_record(RECOMMENDATIONS, doc["_id"])


def view(uow: UnitOfWork, cluster_id: str) -> dict[str, Any]:
    """The rollout, its diff report and its recommendations, as the API answers them."""
    records = _records(uow)
    policy = records.record(POLICIES, cluster_id)
    reports = records.record(SHADOW, cluster_id) or {}
    return {"policy": None if policy is None else _public(policy),
            "diff": ro.report_doc(ro.report_of(reports.get(TRIAGE_REPORT))),
            "repairDiff": ro.report_doc(ro.report_of(reports.get(REPAIR_REPORT)), ro.STEP),
            "recommendations": recommendations(uow, cluster_id)}


def decide(uow: UnitOfWork, deps: Deps, cluster_id: str, rec_id: str, verb: str,
           reason: str, by: str) -> dict[str, Any]:
    """An operator's accept or dismiss of a pending recommendation (a repeat of the same
    decision answers it again and changes nothing)."""
    if verb not in (ACCEPT, DISMISS):
        raise ValidationError("verb", f"must be {ACCEPT} or {DISMISS}")
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError("reason", "is required: say why (it goes in the audit record)")
    records = _records(uow)
    doc = records.record(RECOMMENDATIONS, f"{cluster_id}:{rec_id}")
    if doc is None:
        raise NotFound("recommendation", f"{rec_id} of cluster {cluster_id}")
    rec = ro.recommendation_of(doc)
    verdict = shadow.Verdict.ACCEPTED if verb == ACCEPT else shadow.Verdict.DISMISSED
    if rec.verdict is not shadow.Verdict.PENDING:
        if rec.verdict is verdict and rec.reason == reason and rec.by == by:
            return _public(doc)
        raise Conflict(f"recommendation {rec_id} was already {rec.verdict.value} by "
                       f"{rec.by}: {rec.reason}")
    return _apply(shadow.decide(rec, verdict, deps.clock.now(), by, reason), cluster_id,
                  uow)


def _apply(rec: shadow.Recommendation, cluster_id: str, uow: UnitOfWork) -> dict[str, Any]:
    d = rec.divergence
    node = uow.nodes.get(rec.node_id)
    act = rec.verdict is shadow.Verdict.ACCEPTED and d.candidate.action is not RepairAction.NONE
    if act and (node is None or lifecycle.stale_report(node, d.at)):
        # repaired (or gone) since the fault: the decision is recorded, and acting on the
        # old fault would take the repaired node out again
        act = False
        rec = replace(rec, reason=f"{rec.reason} (not applied: the node was repaired since)")
    doc = {"cluster_id": cluster_id, **ro.recommendation_doc(rec)}
    _records(uow).put_record(RECOMMENDATIONS, f"{cluster_id}:{rec.rec_id}", doc)
    at = rec.decided_at if rec.decided_at is not None else d.at
    uow.emit(NodeOperatorActed(node_id=rec.node_id, cluster_id=cluster_id,
                               action=f"recommendation:{rec.verdict.value}",
                               reason=f"{d.cause} -> {d.candidate.action.value}: {rec.reason}",
                               by=rec.by, at=at))
    if act:
        severity = "warning" if d.candidate.action in _MILD else "critical"
        uow.emit(NodeDiagnosed(
            node_id=rec.node_id, observed_at=d.at, failure_mode=d.candidate.failure_mode,
            severity=severity, action=d.candidate.action.value,
            reasons=(f"recommendation {rec.rec_id} accepted by {rec.by}: {rec.reason}",)))
    return _public(doc)


def expire(uow: UnitOfWork, cluster_id: str, now: float) -> bool:
    """Apply the configured default to every recommendation past its deadline, and keep at
    most ``MAX_DECIDED`` decided ones; True when anything changed."""
    records = _records(uow)
    policy = records.record(POLICIES, cluster_id)
    if policy is None:
        return False
    default = shadow.TimeoutDefault(policy["timeoutDefault"])
    docs = records.records(RECOMMENDATIONS, {"cluster_id": cluster_id})
    recs = [ro.recommendation_of(d) for d in docs]
    due = shadow.expired(recs, now, default)
    for rec in due:
        _apply(rec, cluster_id, uow)
    decided = sorted((d for d in docs if d["verdict"] != shadow.Verdict.PENDING.value),
                     key=lambda d: (d.get("decidedAt") or 0.0, d["_id"]))
    extra: Sequence[dict[str, Any]] = decided[:max(0, len(decided) + len(due) - MAX_DECIDED)]
    for doc in extra:
        records.delete_record(RECOMMENDATIONS, doc["_id"])
    return bool(due or extra)
