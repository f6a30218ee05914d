"""A candidate triage table beside the active one: shadow, recommend-only, then active.

Pure and table-driven. :func:`compare` runs the same triage (:func:`shared.policies.triage.
diagnose`) with both tables on the same report, history and time and returns what differs
(a :class:`Divergence`), or None. :func:`fold` adds one divergence to a :class:`DiffReport`:
one row per (cause, what the active table does, what the candidate would do), counted, at
most ``MAX_ROWS`` rows (the oldest-seen row makes room), so the report stays bounded however
long the shadow runs. :func:`diff_history` folds a recorded history the same way.
:func:`compare_repair` does for a candidate repair configuration what :func:`compare` does
for a table: the repair step it would take on the same facts (``repair_decision.decide``).

The stage of a cause on a partition is :func:`stage_for` over :class:`StageRule` rows: the
most specific row wins (cause and partition named, then cause, then partition, then the
default). The *cause* of a divergence is the failure mode it is about: the active
diagnosis's, or the candidate's where the active table finds the node healthy or unknown.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from shared.domain.health import Diagnosis, FailureRecord, HealthReport, RepairAction
from shared.policies.repair import RepairConfig
from shared.policies.repair_decision import RepairFacts, RepairStep
from shared.policies.repair_decision import decide as decide_repair
from shared.policies.triage import HEALTHY, UNKNOWN, diagnose
from shared.policies.triage_table import TriageTable

ANY = "*"
MAX_ROWS = 64  # cause rows a diff report keeps
MAX_EXAMPLES = 3  # node ids kept per row, for the operator to look at


class Stage(enum.StrEnum):
    SHADOW = "shadow"  # decisions recorded, never applied
    RECOMMEND = "recommend"  # each difference waits for an operator's accept or dismiss
    ACTIVE = "active"  # the candidate decides


class TimeoutDefault(enum.StrEnum):
    ACCEPT = "accept"
    DISMISS = "dismiss"


@dataclass(frozen=True)
class StageRule:
    stage: Stage
    cause: str = ANY
    partition: str = ANY

    def matches(self, cause: str, partition: str) -> bool:
        return self.cause in (ANY, cause) and self.partition in (ANY, partition)

    @property
    def specificity(self) -> int:
        return 2 * (self.cause != ANY) + (self.partition != ANY)


def stage_for(rules: Sequence[StageRule], cause: str, partition: str,
              default: Stage = Stage.SHADOW) -> Stage:
    """The stage of ``cause`` on ``partition``: the most specific matching row's."""
    matching = [r for r in rules if r.matches(cause, partition)]
    if not matching:
        return default
    return max(matching, key=lambda r: r.specificity).stage


@dataclass(frozen=True)
class Decision:
    failure_mode: str
    action: RepairAction

    @classmethod
    def of(cls, diagnosis: Diagnosis) -> Decision:
        return cls(diagnosis.failure_mode, diagnosis.action)


@dataclass(frozen=True)
class Divergence:
    node_id: str
    at: float
    active: Decision
    candidate: Decision
    about: str = ""  # the cause, where the decisions are not diagnoses (repair steps)

    @property
    def cause(self) -> str:
        if self.about:
            return self.about
        if self.active.failure_mode in (HEALTHY, UNKNOWN):
            return self.candidate.failure_mode
        return self.active.failure_mode


@dataclass(frozen=True)
class Compared:
    """Both diagnoses of one report (what the caller applies depends on the stage)."""

    active: Diagnosis
    candidate: Diagnosis
    sightings: tuple[FailureRecord, ...]  # the active table's unconfirmed sightings
    candidate_sightings: tuple[FailureRecord, ...]
    divergence: Divergence | None


def compare(report: HealthReport, history: Sequence[FailureRecord], now: float,
            active: TriageTable, candidate: TriageTable,
            decided: tuple[Diagnosis, tuple[FailureRecord, ...]] | None = None) -> Compared:
    """Triage ``report`` under both tables; a divergence when failure mode or action differ
    (the reasons' wording may differ freely). ``decided``: the active table's ``diagnose``
    of the same input, where the caller has it already."""
    mine, sightings = decided or diagnose(report, history, now, active)
    theirs, their_sightings = diagnose(report, history, now, candidate)
    a, c = Decision.of(mine), Decision.of(theirs)
    divergence = None if a == c else Divergence(report.node_id, now, a, c)
    return Compared(mine, theirs, sightings, their_sightings, divergence)


@dataclass(frozen=True)
class CauseRow:
    cause: str
    active: Decision
    candidate: Decision
    count: int
    first_at: float
    last_at: float
    nodes: tuple[str, ...] = ()  # up to MAX_EXAMPLES example nodes

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.cause, self.active.failure_mode, self.active.action.value,
                self.candidate.failure_mode, self.candidate.action.value)


@dataclass(frozen=True)
class DiffReport:
    """Where a candidate would decide differently, by cause; bounded (``MAX_ROWS``)."""

    evaluated: int = 0  # reports compared
    differing: int = 0  # of them, decided differently
    rows: tuple[CauseRow, ...] = ()
    dropped: int = 0  # rows pushed out by the bound

    @property
    def causes(self) -> tuple[str, ...]:
        """The causes the candidate would treat differently, most often first."""
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.cause] = counts.get(row.cause, 0) + row.count
        return tuple(sorted(counts, key=lambda c: (-counts[c], c)))


def fold(report: DiffReport, divergence: Divergence | None, *, evaluated: int = 1,
         max_rows: int = MAX_ROWS) -> DiffReport:
    """``report`` with one more compared report (``divergence`` None: they agreed)."""
    if divergence is None:
        return replace(report, evaluated=report.evaluated + evaluated)
    d = divergence
    fresh = CauseRow(d.cause, d.active, d.candidate, 1, d.at, d.at, (d.node_id,))
    rows = list(report.rows)
    for i, row in enumerate(rows):
        if row.key == fresh.key:
            nodes = row.nodes if d.node_id in row.nodes or len(row.nodes) >= MAX_EXAMPLES \
                else (*row.nodes, d.node_id)
            rows[i] = replace(row, count=row.count + 1, last_at=max(row.last_at, d.at),
                              nodes=nodes)
            break
    else:
        rows.append(fresh)
    dropped = report.dropped
    while len(rows) > max_rows:  # the row seen least recently makes room
        rows.remove(min(rows, key=lambda r: (r.last_at, r.key)))
        dropped += 1
    rows.sort(key=lambda r: (-r.count, r.key))
    return DiffReport(report.evaluated + evaluated, report.differing + 1, tuple(rows), dropped)


def step_decision(step: RepairStep) -> Decision:
    """A repair step as a Decision: its kind in place of a failure mode."""
    return Decision(step.kind.value, step.action or RepairAction.NONE)


def compare_repair(facts: RepairFacts, now: float, active_step: RepairStep,
                   candidate: RepairConfig) -> Divergence | None:
    """The repair step a candidate repair configuration would take on the same facts, where
    it differs (kind or action) from the step taken; the cause is the diagnosis's."""
    a = step_decision(active_step)
    c = step_decision(decide_repair(facts, now, candidate))
    if a == c:
        return None
    return Divergence(facts.node.node_id, now, a, c, facts.diagnosis.failure_mode)


def diff_history(reports: Iterable[HealthReport], active: TriageTable,
                 candidate: TriageTable) -> DiffReport:
    """A recorded history's reports, oldest first, through both tables.

    Each node's history is what the active table would have recorded: its unconfirmed
    sightings and every fault it acted on, so confirmation rules fire as they did live.
    """
    histories: dict[str, list[FailureRecord]] = {}
    out = DiffReport()
    for report in reports:
        history = histories.setdefault(report.node_id, [])
        now = report.observed_at
        compared = compare(report, history, now, active, candidate)
        history.extend(compared.sightings)
        if compared.active.action is not RepairAction.NONE:
            history.append(FailureRecord(now, compared.active.failure_mode,
                                         compared.active.action))
        out = fold(out, compared.divergence)
    return out


# --- recommendations -------------------------------------------------------------------------


class Verdict(enum.StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    DISMISSED = "dismissed"


@dataclass(frozen=True)
class Recommendation:
    """The candidate's decision on one node, waiting for an operator until ``deadline``."""

    rec_id: str
    node_id: str
    divergence: Divergence
    created_at: float
    deadline: float
    verdict: Verdict = Verdict.PENDING
    decided_at: float | None = None
    by: str = ""
    reason: str = ""


def recommendation_id(divergence: Divergence) -> str:
    """Stable per node, cause and candidate action: a repeated report refreshes, never piles up."""
    return f"{divergence.node_id}:{divergence.cause}:{divergence.candidate.action.value}"


def decide(rec: Recommendation, verdict: Verdict, now: float, by: str, reason: str
           ) -> Recommendation:
    return replace(rec, verdict=verdict, decided_at=now, by=by, reason=reason)


def expired(recs: Iterable[Recommendation], now: float, default: TimeoutDefault,
            ) -> list[Recommendation]:
    """The pending recommendations past their deadline, decided by the configured default."""
    verdict = Verdict.ACCEPTED if default is TimeoutDefault.ACCEPT else Verdict.DISMISSED
    return [decide(r, verdict, now, "timeout", f"no operator decision by the deadline: "
                   f"{default.value} (the configured default)")
            for r in recs if r.verdict is Verdict.PENDING and now >= r.deadline]
