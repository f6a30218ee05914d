"""The pure side of a candidate triage table: compare, the bounded diff report, stages, a
recorded history's diff, the rollout document's validation and stored forms."""

from __future__ import annotations

import pytest

from shared.domain.errors import ValidationError
from shared.domain.health import Condition, HealthReport, RepairAction
from shared.policies import triage_rollout as ro
from shared.policies.shadow import (
    Decision,
    DiffReport,
    Divergence,
    Recommendation,
    Stage,
    StageRule,
    TimeoutDefault,
    Verdict,
    compare,
    diff_history,
    expired,
    fold,
    stage_for,
)
from shared.policies.triage_table import load_triage_table, parse_triage_table
from tests.candidates import CAUSE, packaged, rollout, stricter_xid13
from tests.harness import healthy, xid

ACTIVE = load_triage_table()
CANDIDATE = parse_triage_table(stricter_xid13())


def _report(node: str, conditions: tuple[dict[str, object], ...], at: float) -> HealthReport:
    return HealthReport(node, at, Condition.parse_all(conditions), "agent")


def test_compare_finds_the_difference_and_only_it() -> None:
    same = compare(_report("n", xid(79, 1.0), 1.0), (), 1.0, ACTIVE, CANDIDATE)
    assert same.divergence is None and same.active == same.candidate
    differs = compare(_report("n", xid(13, 1.0), 1.0), (), 1.0, ACTIVE, CANDIDATE)
    assert differs.divergence == Divergence(
        "n", 1.0, Decision(CAUSE, RepairAction.RESTART_JOB), Decision(CAUSE, RepairAction.RESET_GPU))
    assert differs.divergence.cause == CAUSE
    assert compare(_report("n", healthy(1.0), 1.0), (), 1.0, ACTIVE, CANDIDATE).divergence is None


def test_the_cause_is_the_candidates_where_the_active_table_sees_nothing() -> None:
    d = Divergence("n", 1.0, Decision("healthy", RepairAction.NONE),
                   Decision("new_fault", RepairAction.REBOOT))
    assert d.cause == "new_fault"


def _d(node: str, cause: str, at: float) -> Divergence:
    return Divergence(node, at, Decision(cause, RepairAction.RESTART_JOB),
                      Decision(cause, RepairAction.RESET_GPU))


def test_the_diff_report_counts_by_cause_and_stays_bounded() -> None:
    report = DiffReport()
    for i in range(5):
        report = fold(report, _d(f"n{i}", "a", float(i)))
    report = fold(report, None)
    report = fold(report, _d("n9", "b", 10.0))
    assert (report.evaluated, report.differing, report.causes) == (7, 6, ("a", "b"))
    assert report.rows[0].count == 5 and report.rows[0].nodes == ("n0", "n1", "n2")
    assert (report.rows[0].first_at, report.rows[0].last_at) == (0.0, 4.0)
    for i in range(10):
        report = fold(report, _d("m", f"c{i}", 20.0 + i), max_rows=4)
    assert len(report.rows) == 4 and report.dropped == 8
    assert "a" not in report.causes  # the least recently seen rows made room
    assert set(report.causes) == {"c6", "c7", "c8", "c9"}


def test_stage_for_takes_the_most_specific_row() -> None:
    rules = (StageRule(Stage.RECOMMEND), StageRule(Stage.ACTIVE, partition="p1"),
             StageRule(Stage.SHADOW, cause="x"), StageRule(Stage.ACTIVE, cause="x", partition="p2"))
    assert stage_for(rules, "y", "p0") is Stage.RECOMMEND
    assert stage_for(rules, "y", "p1") is Stage.ACTIVE
    assert stage_for(rules, "x", "p1") is Stage.SHADOW  # a cause row beats a partition row
    assert stage_for(rules, "x", "p2") is Stage.ACTIVE
    assert stage_for((), "x", "p") is Stage.SHADOW


def test_a_recorded_history_names_the_causes_treated_differently() -> None:
    reports = [_report("a", xid(13, 1.0), 1.0), _report("b", xid(79, 2.0), 2.0),
               _report("a", healthy(3.0), 3.0), _report("c", xid(13, 4.0), 4.0)]
    report = diff_history(reports, ACTIVE, CANDIDATE)
    assert report.causes == (CAUSE,)
    assert (report.evaluated, report.differing) == (4, 2)
    assert report.rows[0].nodes == ("a", "c")
    assert diff_history(reports, ACTIVE, ACTIVE).causes == ()


def test_expired_recommendations_take_the_default() -> None:
    rec = Recommendation("r", "n", _d("n", "a", 0.0), 0.0, 10.0)
    assert expired([rec], 9.0, TimeoutDefault.ACCEPT) == []
    [done] = expired([rec], 10.0, TimeoutDefault.ACCEPT)
    assert (done.verdict, done.by, done.decided_at) == (Verdict.ACCEPTED, "timeout", 10.0)
    [gone] = expired([rec], 10.0, TimeoutDefault.DISMISS)
    assert gone.verdict is Verdict.DISMISSED and "dismiss" in gone.reason


def test_the_rollout_document_is_validated_naming_the_key() -> None:
    policy = ro.parse_rollout(rollout({"stage": "recommend", "cause": CAUSE}))
    assert policy.rules == (StageRule(Stage.RECOMMEND, CAUSE),)
    assert (policy.default_stage, policy.recommend_timeout_s,
            policy.timeout_default) == (Stage.SHADOW, 3600.0, TimeoutDefault.DISMISS)
    bad_action = stricter_xid13()
    bad_action["xid"]["rules"][0]["action"] = "explode"
    cases = [
        ({"candidate": bad_action}, "candidate.xid.rules[0].action"),
        ({}, "candidate"),
        ({"candidate": packaged(), "stages": [{"stage": "live"}]}, "stages[0].stage"),
        ({"candidate": packaged(), "stages": [{"stage": "active"}, {"stage": "shadow"}]},
         "stages[1]"),
        ({"candidate": packaged(), "recommendTimeoutS": 0}, "recommendTimeoutS"),
        ({"candidate": packaged(), "timeoutDefault": "maybe"}, "timeoutDefault"),
        ({"candidate": packaged(), "extra": 1}, "extra"),
        ({"repair": {"ladder": ["explode"]}}, "repair.ladder"),
        ({"repair": {"lemon_failure_count": 0}}, "repair.lemon_failure_count"),
    ]
    for doc, path in cases:
        with pytest.raises(ValidationError) as err:
            ro.parse_rollout(doc)
        assert path in str(err.value), (doc.keys(), str(err.value))


def test_stored_forms_round_trip() -> None:
    report = fold(fold(DiffReport(), _d("n", "a", 1.0)), None)
    assert ro.report_of(ro.report_doc(report)) == report
    assert ro.report_of(ro.report_doc(report, ro.STEP)) == report
    only_repair = ro.parse_rollout({"repair": {"lemon_failure_count": 2}})
    assert only_repair.candidate is None and only_repair.repair is not None
    assert only_repair.repair.lemon_failure_count == 2
    rec = Recommendation("r", "n", _d("n", "a", 1.0), 1.0, 5.0, Verdict.DISMISSED, 2.0, "me", "no")
    assert ro.recommendation_of(ro.recommendation_doc(rec)) == rec
    doc = ro.parse_rollout(rollout()).doc
    assert ro.parse_rollout(doc).doc == doc  # the stored form parses back to itself
    assert ro.digest(doc) == ro.digest(ro.parse_rollout(rollout()).doc)
    assert ro.digest(doc) != ro.digest(ro.parse_rollout(rollout({"stage": "active"})).doc)
