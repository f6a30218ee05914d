"""``mtc replay``: a recorded event history through a candidate triage table and repair
configuration, before the candidate goes live.

Every health report of the history goes, in time order, through the real policies
(``shared.policies.triage.triage`` and ``shared.policies.repair.plan_repair``) twice: once under
the baseline policy (the packaged table and default repair configuration, or ``--baseline``)
and once under the candidate, each with its own node histories (the repair ladder, the lemon
count, confirmations) and its own blast-radius state. What each policy decides for a report
is one of: nothing, restart the job, a hold (the guard refused), or a repair (a cordon: the node
leaves service for the action; ``replace`` is a replacement). A node a policy took out is out of
service for that policy for the action's repair time (fitted from the same history, else the
twin's defaults) and its reports meanwhile are not acted on; one fault (node, condition,
``since``) reported again is acted on once, as the triage service does.

The report says, per node and in total, how many cordons, actions, holds and replacements each
policy made and every report on which they differ. With ``twin=True`` (``--twin``) a scenario is
fitted to the history (``simulator.fit``), the twin runs it under both policies over the same
seeds (common random numbers) and the goodput difference is reported with its 95% interval.
The faults are re-drawn from the fitted rates, not replayed at their recorded times.

A policy directory holds ``triage_table.yaml`` (``shared/policies/triage_table.py`` format; any
``triage_table*.yaml``) and optionally ``repair.yaml`` (``RepairConfig`` fields).
"""

from __future__ import annotations

import copy
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared import yaml_text
from shared.domain.errors import ValidationError
from shared.domain.health import Condition, FailureRecord, HealthReport, RepairAction
from shared.policies.repair import (
    DecisionKind,
    PartitionView,
    RepairConfig,
    load_repair_config,
    plan_repair,
)
from shared.policies.triage import triage, unconfirmed_sightings
from shared.policies.triage_table import TriageTable, load_triage_table
from simulator.scenario_types import DEFAULT_REPAIR_MEDIAN_S
from simulator.stats import wide_mark

__all__ = ["Decision", "Policy", "PolicyError", "Replay", "load_policy", "replay", "twin_diff"]

OPERATOR_TYPES = frozenset({"DrainedByOperator", "ResumedByOperator"})
KINDS = ("cordons", "actions", "holds", "replacements")


class PolicyError(ValueError):
    """A policy directory that cannot be loaded (the message names the file and key)."""


@dataclass(frozen=True)
class Policy:
    name: str
    table: TriageTable
    repair: RepairConfig
    table_path: Path | None = None  # for the twin: the file the table came from
    repair_raw: Mapping[str, Any] = field(default_factory=dict)


def load_policy(path: str | Path | None, name: str = "") -> Policy:
    """The packaged policy (``None``), or a directory / triage table file."""
    if path is None:
        return Policy(name or "baseline", load_triage_table(), RepairConfig())
    p = Path(path)
    if p.is_dir():
        tables = sorted(p.glob("triage_table*.yaml"))
        if not tables:
            raise PolicyError(f"{p}: no triage_table*.yaml in the policy directory")
        table_path, repair_path = tables[0], p / "repair.yaml"
    elif p.is_file():
        table_path, repair_path = p, p.with_name("repair.yaml")
    else:
        raise PolicyError(f"{p}: no such policy directory or file")
    try:
        table = load_triage_table(table_path)
    except ValidationError as exc:
        raise PolicyError(f"{table_path}: {exc}") from None
    raw: dict[str, Any] = {}
    if repair_path.is_file():
        loaded = yaml_text.safe_load(repair_path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise PolicyError(f"{repair_path}: must be a mapping of RepairConfig fields")
        raw = loaded
    try:
        repair = load_repair_config(raw)
    except ValidationError as exc:
        raise PolicyError(f"{repair_path}: {exc}") from None
    return Policy(name or p.name, table, repair, table_path, raw)


@dataclass(frozen=True)
class Decision:
    kind: str  # none | restart_job | hold | repair
    action: str
    failure_mode: str

    def label(self) -> str:
        return self.kind if self.kind in ("none", "restart_job") else f"{self.kind} {self.action}"


NOTHING = Decision("none", "none", "")


@dataclass
class _PolicyState:
    policy: Policy
    history: dict[str, list[FailureRecord]] = field(default_factory=lambda: defaultdict(list))
    out_until: dict[str, float] = field(default_factory=dict)
    removed_at: list[float] = field(default_factory=list)
    acted: set[tuple[str, str, float]] = field(default_factory=set)
    counts: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def decide(self, report: HealthReport, now: float, fleet: int,
               durations: Mapping[str, float]) -> Decision:
        node = report.node_id
        if self.out_until.get(node, -1.0) > now:
            return NOTHING  # out of service under this policy: it would not be reporting
        table, history = self.policy.table, self.history[node]
        faults = [(c.type, round(c.since, 3)) for c in report.conditions
                  if c.status.value == "true" and c.type not in OPERATOR_TYPES]
        diagnosis = triage(report, history, now, table)
        history.extend(unconfirmed_sightings(report, history, now, table))
        if diagnosis.healthy or diagnosis.action is RepairAction.NONE or not faults:
            return NOTHING
        keys = {(node, t, s) for t, s in faults}
        if keys <= self.acted:
            return NOTHING  # the same fault reported again: acted on once
        self.acted |= keys
        out = frozenset(n for n, t in self.out_until.items() if t > now)
        view = PartitionView("all", fleet, out, tuple(self.removed_at))
        decision = plan_repair(diagnosis, history, view, node, now, self.policy.repair)
        mode = diagnosis.failure_mode
        if decision.kind is DecisionKind.NO_ACTION:
            return NOTHING
        counts = self.counts[node]
        counts["actions"] += 1
        if decision.kind is DecisionKind.HOLD:
            counts["holds"] += 1
            return Decision("hold", decision.action.value, mode)
        history.append(FailureRecord(now, mode, decision.action))
        if decision.kind is DecisionKind.RESTART_JOB:
            return Decision("restart_job", "restart_job", mode)
        counts["cordons"] += 1
        if decision.action is RepairAction.REPLACE:
            counts["replacements"] += 1
        self.removed_at.append(now)
        self.out_until[node] = now + durations.get(decision.action.value, 3600.0)
        return Decision("repair", decision.action.value, mode)

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for c in self.counts.values():
            for k in KINDS:
                out[k] += c[k]
        return out


@dataclass(frozen=True)
class Difference:
    time: float
    node_id: str
    baseline: Decision
    candidate: Decision


@dataclass
class Replay:
    baseline: str
    candidate: str
    reports: int
    nodes: int
    per_node: dict[str, dict[str, dict[str, int]]]  # node -> policy -> kind -> count
    totals: dict[str, dict[str, int]]  # policy -> kind -> count
    differences: list[Difference]
    twin: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "candidate": self.candidate,
                "reports": self.reports, "nodes": self.nodes, "totals": self.totals,
                "per_node": self.per_node,
                "differences": [{"time": d.time, "node_id": d.node_id,
                                 "baseline": d.baseline.label(), "candidate": d.candidate.label(),
                                 "failure_mode": d.candidate.failure_mode
                                 or d.baseline.failure_mode} for d in self.differences],
                "twin": self.twin}

    def lines(self, limit: int = 20) -> list[str]:
        """Plain lines (nothing to cut on a narrow terminal)."""
        out = [f"{self.reports} health reports of {self.nodes} nodes replayed under "
               f"{self.baseline} (baseline) and {self.candidate} (candidate)"]
        for kind in KINDS:
            b, c = self.totals[self.baseline][kind], self.totals[self.candidate][kind]
            out.append(f"  {kind}: {b} -> {c} ({c - b:+d})")
        changed = {n: v for n, v in self.per_node.items() if v[self.baseline] != v[self.candidate]}
        out.append(f"nodes decided differently: {len(changed)}")
        for node, v in sorted(changed.items())[:limit]:
            was, now = v[self.baseline], v[self.candidate]
            out.append(f"  {node}: " + ", ".join(f"{k} {was[k]} -> {now[k]}" for k in KINDS
                                                if was[k] != now[k]))
        out.append(f"reports decided differently: {len(self.differences)}")
        for d in self.differences[:limit]:
            out.append(f"  t+{d.time:.0f}s {d.node_id} "
                       f"{d.candidate.failure_mode or d.baseline.failure_mode}: "
                       f"{d.baseline.label()} -> {d.candidate.label()}")
        if self.twin is not None:
            t = self.twin
            out.append(f"twin ({t['replications']} replications of the fitted scenario, same "
                       f"seeds): goodput {t['baseline_goodput']:.4f} -> "
                       f"{t['candidate_goodput']:.4f}, difference {t['difference']:+.4f} "
                       f"± {t['ci']:.4f} (95%){wide_mark(int(t['replications']))}; "
                       f"repairs per run {t['baseline_repairs']:.1f} -> "
                       f"{t['candidate_repairs']:.1f}, replacements "
                       f"{t.get('baseline_replacements', 0):.1f} -> "
                       f"{t.get('candidate_replacements', 0):.1f}")
        return out


def _fleet(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    nodes = {str(r["data"]["node_id"]) for r in rows if r["type"] == "mtc.node.health_reported.v1"}
    for r in rows:
        if r["type"] == "mtc.job.started.v1":
            nodes.update(r["data"].get("node_ids", ()))
    return nodes


def replay(rows: Sequence[Mapping[str, Any]], candidate: Policy, baseline: Policy,
           durations: Mapping[str, float] | None = None) -> Replay:
    """Both policies' decisions on every health report of ``rows`` (time order)."""
    fleet = _fleet(rows)
    times = dict(DEFAULT_REPAIR_MEDIAN_S)
    times.update(durations or {})
    states = {baseline.name: _PolicyState(baseline), candidate.name: _PolicyState(candidate)}
    if len(states) < 2:
        raise PolicyError("the baseline and the candidate need different names")
    t0 = float(rows[0]["time"]) if rows else 0.0
    diffs: list[Difference] = []
    reports = 0
    for row in rows:
        if row["type"] != "mtc.node.health_reported.v1":
            continue
        d = row["data"]
        try:
            report = HealthReport(str(d["node_id"]), float(d["observed_at"]),
                                  Condition.parse_all(d.get("conditions", ())),
                                  str(d.get("source", "agent")))
        except (KeyError, ValidationError, ValueError):
            continue  # a report triage would have refused too
        reports += 1
        now = float(row["time"])
        got = {name: s.decide(report, now, len(fleet), times) for name, s in states.items()}
        b, c = got[baseline.name], got[candidate.name]
        if b != c:
            diffs.append(Difference(now - t0, report.node_id, b, c))
    per_node = {n: {name: {k: s.counts[n][k] for k in KINDS} for name, s in states.items()}
                for n in sorted(fleet)}
    return Replay(baseline.name, candidate.name, reports, len(fleet), per_node,
                  {name: s.totals() for name, s in states.items()}, diffs)


def twin_diff(rows: Sequence[Mapping[str, Any]], candidate: Policy, baseline: Policy, *,
              replications: int = 5, seed: int = 1) -> dict[str, Any]:
    """The twin on a scenario fitted to ``rows``, under both policies, same seeds: the
    candidate's goodput less the baseline's, with its 95% interval (paired differences)."""
    from simulator import fit, fitted, twin
    from simulator.scenario import parse_scenario
    from simulator.stats import mean_ci

    raw = fitted.to_scenario(fit.fit(rows), name="replay")
    results: dict[str, list[float]] = {}
    repairs: dict[str, float] = {}
    replaced: dict[str, float] = {}
    for policy in (baseline, candidate):
        body = copy.deepcopy(raw)
        body["control_plane"] = {"repair": dict(policy.repair_raw)}
        if policy.table_path is not None:
            body["control_plane"]["triage_table"] = str(policy.table_path)
        sc = parse_scenario(body)
        runs = [twin.run(sc, seed=seed + r) for r in range(replications)]
        results[policy.name] = [run.accounting.fleet.goodput for run in runs]
        repairs[policy.name] = sum(sum(v for k, v in run.repairs.items() if k != "held")
                                   for run in runs) / replications
        replaced[policy.name] = sum(run.repairs.get("replace", 0) for run in runs) / replications
    base, cand = results[baseline.name], results[candidate.name]
    mean, half, _ = mean_ci([c - b for b, c in zip(base, cand, strict=True)])
    return {"replications": replications, "seeds": [seed + r for r in range(replications)],
            "baseline_goodput": sum(base) / len(base), "candidate_goodput": sum(cand) / len(cand),
            "difference": mean, "ci": half,
            "baseline_repairs": repairs[baseline.name], "candidate_repairs": repairs[candidate.name],
            "baseline_replacements": replaced[baseline.name],
            "candidate_replacements": replaced[candidate.name]}
