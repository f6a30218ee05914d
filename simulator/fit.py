"""``mtc sim fit``: a scenario the twin runs, estimated from a recorded event history.

What is estimated, from the rows of :mod:`simulator.history`:

- per-cause failure rates, per node-day, with exact Poisson intervals (the Gamma quantiles of
  Garwood, "Fiducial limits for the Poisson distribution", Biometrika 28, 1936). A fault is
  either a node's health report turning a condition TRUE (its ``cause`` detail names it, else
  the failure mode triage diagnosed) over the node-days the fleet was up, or, for causes with
  no signal, an attempt's crash (``cause=`` in the exit detail) over the node-days jobs ran.
  One fault is one count until the node is cleared (returned to service, retired, or a report
  in which every check passed): what a post-repair or deep check finds on it before then
  (its ``since`` is the check's time) is the fault the repair did not fix, and so is a report
  whose ``since`` is before the last repair; only a fault that began after a repair completed
  is a new one;
- each cause's signal (the first report's condition), true fix (the last repair action
  before the node returned to service, ``replace`` when it was retired) and whether it kills
  the job it hits (the attempt crashed soon after most of its faults on a job's node);
- repair durations per action (lognormal: median and sigma of the logs) and the chance the
  action itself failed (``ok=false``, except a node that "did not come back": that fault needed
  a higher rung; Wilson score interval);
- detection delays per signal kind (report time less the fault's ``since``; a lost heartbeat
  less the heartbeat timeout);
- the fleet (nodes, the job's nodes, spares) and each job's figures, measured as the live
  goodput accounting measures them (``shared.goodput.infer_params``).

Not estimated (left at the twin's defaults, said in the scenario's description): lemons, the
diurnal slowdown, stragglers, planned restarts, the bus. Pure over the rows. What a fit says
(plain lines, the scenario it makes) is :mod:`simulator.fitted`.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain.exits import GRACEFUL
from shared.goodput import infer_params
from shared.goodput.live import pace
from simulator.intervals import (
    THIN_CONFIDENCE,
    Interval,
    gamma_quantile,
    poisson_interval,
    thin_history,
    wilson_interval,
)

__all__ = ["THIN_CONFIDENCE", "CauseFit", "Fit", "Interval", "RepairFit", "fit",
           "gamma_quantile", "poisson_interval", "thin_history", "wilson_interval"]

DAY_S = 86_400.0
OPERATOR_TYPES = frozenset({"DrainedByOperator", "ResumedByOperator", "SlowSpeedCheck"})
DETECTION_OF = {"XidError": "xid", "EccUncorrectable": "ecc", "RowRemapFailure": "ecc",
                "DcgmDiagFailed": "dcgm", "DiskPressure": "disk", "ThermalThrottling": "thermal",
                "HeartbeatLost": "heartbeat"}
ACTIONS = ("reset_gpu", "reboot", "reimage", "replace")
_TOKEN = re.compile(r"(\w+)=(\S+)")
NOT_BACK = "did not come back"  # a repair's detail when the fault needed a higher rung



@dataclass(frozen=True)
class CauseFit:
    name: str
    count: int
    exposure_node_days: float
    per_node_day: Interval
    observed: str  # health (a report) | exit (only a crash shows it)
    signal: Mapping[str, Any]
    fix: Mapping[str, float]
    kills_job: bool = True
    # (weight, signal, fix) per signal when the cause was reported more than one way
    variants: tuple[tuple[float, Mapping[str, Any], Mapping[str, float]], ...] = ()


@dataclass(frozen=True)
class RepairFit:
    action: str
    count: int
    median_s: float
    sigma: float
    failure: Interval


@dataclass(frozen=True)
class Fit:
    window_s: float
    nodes: int
    job_nodes: int
    node_days: float
    job_node_days: float
    causes: tuple[CauseFit, ...]
    repairs: tuple[RepairFit, ...]
    detection: Mapping[str, tuple[int, float, float]]  # kind -> (count, median s, sigma)
    jobs: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    confidence: float = 0.95  # of every interval: wider on a thin history (``warnings``)
    warnings: tuple[str, ...] = ()

    def cause(self, name: str) -> CauseFit:
        return next(c for c in self.causes if c.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s, "nodes": self.nodes, "job_nodes": self.job_nodes,
            "node_days": self.node_days, "job_node_days": self.job_node_days,
            "causes": {c.name: {"count": c.count, "observed": c.observed,
                                "per_1000_node_days": {k: v * 1000 for k, v in
                                                       c.per_node_day.as_dict().items()},
                                "fix": dict(c.fix), "kills_job": c.kills_job,
                                "variants": [{"weight": w, "signal": dict(sig), "fix": dict(fx)}
                                             for w, sig, fx in c.variants]}
                       for c in self.causes},
            "repairs": {r.action: {"count": r.count, "median_s": r.median_s, "sigma": r.sigma,
                                   "failure": r.failure.as_dict()} for r in self.repairs},
            "detection": {k: {"count": n, "median_s": m, "sigma": s}
                          for k, (n, m, s) in self.detection.items()},
            "jobs": {k: dict(v) for k, v in self.jobs.items()},
            "confidence": self.confidence, "warnings": list(self.warnings),
        }


def _lognormal(values: Sequence[float]) -> tuple[float, float]:
    logs = [math.log(max(v, 1e-6)) for v in values]
    sigma = statistics.pstdev(logs) if len(logs) > 1 else 0.0
    return math.exp(statistics.fmean(logs)), sigma


def fit(rows: Sequence[Mapping[str, Any]], *, heartbeat_timeout_s: float = 60.0) -> Fit:
    """Estimate failure, repair, detection and fleet figures from ``rows`` (time order)."""
    if not rows:
        raise ValueError("the history is empty")
    ready = next((float(r["time"]) for r in rows if r["type"] == "mtc.cluster.ready.v1"), None)
    start = ready if ready is not None else float(rows[0]["time"])
    end = float(rows[-1]["time"])
    if end <= start:
        raise ValueError("the history spans no time after the cluster was ready")
    up_from: dict[str, float] = {}
    retired: dict[str, float] = {}
    replaced_at: dict[str, float] = {}  # replacement node -> when the old one was retired
    faults: list[tuple[float, str, str, str, Mapping[str, Any]]] = []  # since, node, cause..
    seen_faults: set[tuple[str, float]] = set()
    # node -> when a repair of its counted, not yet cleared fault last completed (-inf: none)
    open_fault: dict[str, float] = {}
    delays: dict[str, list[float]] = defaultdict(list)
    diagnosed: dict[str, list[tuple[float, str]]] = defaultdict(list)
    node_events: dict[str, list[tuple[float, str, str]]] = defaultdict(list)
    repair_open: dict[tuple[str, int], tuple[float, str]] = {}
    repair_runs: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    attempts: dict[tuple[str, int], tuple[float, tuple[str, ...]]] = {}
    crashes: list[tuple[float, tuple[str, ...], str, float]] = []  # crash, nodes, cause, start
    job_node_s = 0.0
    reported: set[str] = set()
    ended: list[tuple[float, float, frozenset[str], int]] = []  # start, exit, nodes, code
    for r in rows:
        t, d, type_ = float(r["time"]), r["data"], r["type"]
        node = str(d.get("node_id", ""))
        if type_ == "mtc.node.provisioned.v1" and d.get("ok", True):
            up_from.setdefault(node, t)
            if node in replaced_at:
                repair_runs["replace"].append((t - replaced_at.pop(node), True))
        elif type_ == "mtc.node.retired.v1":
            open_fault.pop(node, None)
            retired.setdefault(node, t)
            node_events[node].append((t, "retired", ""))
            if d.get("replacement_id"):
                replaced_at[str(d["replacement_id"])] = t
        elif type_ == "mtc.node.health_reported.v1":
            up_from.setdefault(node, start)
            reported.add(node)
            conditions = d.get("conditions") or ()
            if conditions and all(c.get("status") != "true" for c in conditions):
                open_fault.pop(node, None)  # every check passed: whatever it had is gone
            for c in conditions:
                ctype = str(c.get("type"))
                if c.get("status") != "true" or ctype in OPERATOR_TYPES:
                    continue
                details = c.get("details") or {}
                observed = float(d.get("observed_at", t))
                since = float(c.get("since", t))
                kind = DETECTION_OF.get(ctype)
                delay = observed - since
                if kind == "heartbeat":  # its since is the report's; the silence says more
                    silent = float(details.get("silent_for_s", 0.0))
                    since, delay = observed - silent, silent - heartbeat_timeout_s
                key = (node, round(since, 3))
                if key in seen_faults or _same_fault(open_fault.get(node), since,
                                                     str(d.get("source", ""))):
                    continue  # the same fault reported again (or a second condition of it)
                seen_faults.add(key)
                open_fault[node] = -math.inf
                if kind is not None:
                    delays[kind].append(max(0.0, delay))
                faults.append((since, node, str(details.get("cause") or ""), ctype, details))
        elif type_ == "mtc.node.diagnosed.v1":
            diagnosed[node].append((t, str(d.get("failure_mode", ""))))
        elif type_ == "mtc.node.repair_started.v1":
            repair_open[(node, int(d["attempt"]))] = (t, str(d["action"]))
            node_events[node].append((t, "repair", str(d["action"])))
        elif type_ == "mtc.node.repair_completed.v1":
            opened = repair_open.pop((node, int(d["attempt"])), None)
            # a node that does not come back needed a higher rung: the action did not fail
            mechanical = not d.get("ok") and NOT_BACK not in str(d.get("detail", ""))
            if mechanical:
                node_events[node].append((t, "failed", str(d["action"])))
            if d.get("ok") and node in open_fault:
                open_fault[node] = t  # a fault since now is a new one, unless checks find it
            if opened is not None:
                repair_runs[opened[1]].append((t - opened[0], not mechanical))
        elif type_ == "mtc.node.returned_to_service.v1":
            open_fault.pop(node, None)
            node_events[node].append((t, "returned", ""))
        elif type_ == "mtc.job.started.v1":
            attempts[(str(d["job_id"]), int(d["attempt"]))] = (t, tuple(d.get("node_ids", ())))
        elif type_ == "mtc.job.workers_exited.v1":
            began = attempts.get((str(d["job_id"]), int(d["attempt"])))
            if began is not None:
                ended.append((began[0], t, frozenset(began[1]), int(d.get("exit_code", 0))))
                job_node_s += (t - began[0]) * len(began[1])
                tokens = dict(_TOKEN.findall(str(d.get("detail", ""))))
                if int(d.get("exit_code", 0)) not in GRACEFUL and "cause" in tokens:
                    at = float(tokens.get("crashed_at", t))
                    crashes.append((at, began[1], tokens["cause"], began[0]))
    finished = {(t0, nodes) for t0, _, nodes, _ in ended}
    for t0, nodes in attempts.values():  # attempts still running at the end
        if (t0, frozenset(nodes)) not in finished:
            job_node_s += (end - t0) * len(nodes)
            ended.append((t0, end, frozenset(nodes), 0))
    # the fleet: nodes that reported health or ran a job (a login node does neither)
    fleet = reported | {n for _, nodes in attempts.values() for n in nodes}
    up_from = {n: t for n, t in up_from.items() if n in fleet}
    node_s = sum(max(0.0, retired.get(n, end) - max(start, t)) for n, t in up_from.items())
    initial = [n for n, t in up_from.items() if t <= start]
    first_job = next((r["data"] for r in rows if r["type"] == "mtc.job.started.v1"), None)
    job_nodes = len(first_job.get("node_ids", ())) if first_job else 0
    by_cause: dict[str, list[tuple[float, str, str, Mapping[str, Any]]]] = defaultdict(list)
    for since, node, cause, ctype, details in faults:
        name = cause or _mode_after(diagnosed[node], since) or ctype
        by_cause[name].append((since, node, ctype, details))
    fault_times: dict[str, list[float]] = defaultdict(list)
    for since, node, _, _, _ in faults:
        fault_times[node].append(since)
    exit_only: dict[str, int] = defaultdict(int)
    for at, nodes, cause, attempt_start in crashes:
        if cause in by_cause and any(n in nodes and abs(s - at) < 1.0
                                     for s, n, _, _ in by_cause[cause]):
            continue  # the same fault, already counted from its report
        if not any(n in nodes and attempt_start <= s <= at + 1.0
                   for fs in by_cause.values() for s, n, _, _ in fs):
            exit_only[cause] += 1
    node_days, job_node_days = node_s / DAY_S, max(job_node_s / DAY_S, 1e-9)
    warnings = thin_history(end - start, node_days)
    conf = THIN_CONFIDENCE if warnings else 0.95
    causes = []
    for name, fs in sorted(by_cause.items()):
        groups = sorted(_by_signal(fs), key=lambda g: -len(g[1]))  # the most common first
        variants = tuple((round(len(g) / len(fs), 4), sig, _fixes(g, node_events, fault_times))
                         for sig, g in groups) if len(groups) > 1 else ()
        causes.append(CauseFit(name, len(fs), node_days,
                               poisson_interval(len(fs), node_days, conf), "health",
                               groups[0][0], _fixes(fs, node_events, fault_times),
                               _kills(fs, ended), variants))
    causes += [CauseFit(name, n, job_node_days, poisson_interval(n, job_node_days, conf),
                        "exit", {},
                        {"none": 1.0}) for name, n in sorted(exit_only.items())
               if name not in by_cause]
    repairs = []
    for action in ACTIONS:
        runs = repair_runs.get(action, [])
        if runs:
            median, sigma = _lognormal([s for s, _ in runs])
            fails = sum(1 for _, ok in runs if not ok)
            repairs.append(RepairFit(action, len(runs), median, sigma,
                                     wilson_interval(fails, len(runs), conf)))
    # a delay of 0 is a report sent as the fault happened (a launch on a broken node): it says
    # nothing of the detection delay
    detection = {k: (len(pos), *_lognormal(pos)) for k, v in sorted(delays.items())
                 if (pos := [x for x in v if x > 0])}
    jobs: dict[str, dict[str, float]] = {}
    for job_id in sorted({k for k, _ in attempts}):
        p = infer_params(rows, job_id, job_nodes)
        jobs[job_id] = {"nodes": float(p.nodes)}
        if pace(rows, job_id, p.checkpoint_save_s) is None:
            continue  # fewer than two checkpoints in any attempt: the pace is unknown
        gaps = _checkpoint_gaps(rows, job_id)
        jobs[job_id].update(step_time_s=p.step_time_s, checkpoint_save_s=p.checkpoint_save_s,
                            startup_s=p.startup_s,
                            checkpoint_interval_s=statistics.median(gaps) - p.checkpoint_save_s)
    return Fit(end - start, len(initial), job_nodes, node_days, job_node_days, tuple(causes),
               tuple(repairs), detection, jobs, conf, warnings)


def _by_signal(faults: Sequence[tuple[float, str, str, Mapping[str, Any]]]
               ) -> list[tuple[dict[str, Any], list[tuple[float, str, str, Mapping[str, Any]]]]]:
    """A cause's faults by the signal they were first reported with: each signal is a
    weighted variant of the cause, with its own fixes. (One signal for all, the first fault's,
    would re-run ``small``'s faulty GPU, XID 79 or 119, as 119s only, and a candidate's XID 79
    rule would never fire in ``replay --twin``.)"""
    groups: dict[str, tuple[dict[str, Any], list[tuple[float, str, str, Mapping[str, Any]]]]] = {}
    for fault in faults:
        signal = _signal(fault[2], fault[3])
        groups.setdefault(repr(sorted(signal.items())), (signal, []))[1].append(fault)
    return list(groups.values())


CHECK_SOURCES = frozenset({"post-repair-check", "deep-check"})  # their since: the check's time


def _same_fault(repaired_at: float | None, since: float, source: str) -> bool:
    """Whether a TRUE condition on a node with a counted, not yet cleared fault is that fault.
    ``repaired_at`` is when a repair of it last completed (-inf: none yet). A check after the
    repair finding one, with the check's time as ``since``, is the fault the repair did not
    fix; the agent's own report says when its fault happened: after the repair, a new one."""
    if repaired_at is None:
        return False
    return source in CHECK_SOURCES or since <= repaired_at


KILL_WINDOW_S = 900.0  # a fault that kills a job makes it crash within this (NCCL watchdog)


def _kills(faults: Sequence[tuple[float, str, str, Mapping[str, Any]]],
           ended: Sequence[tuple[float, float, frozenset[str], int]]) -> bool:
    """Whether the cause kills the job it hits: most of its faults on a running attempt's
    node were followed by that attempt crashing (True when none hit a job: the default)."""
    hit = killed = 0
    for since, node, _, _ in faults:
        running = [(t1, code) for t0, t1, nodes, code in ended
                   if node in nodes and t0 <= since <= t1]
        if running:
            hit += 1
            t1, code = running[0]
            killed += code not in GRACEFUL and t1 - since <= KILL_WINDOW_S
    return hit == 0 or killed * 2 >= hit


def _mode_after(diagnoses: list[tuple[float, str]], since: float) -> str:
    return next((mode for t, mode in diagnoses if t >= since), "")


def _checkpoint_gaps(rows: Sequence[Mapping[str, Any]], job_id: str) -> list[float]:
    points = [(int(r["data"]["attempt"]), float(r["data"].get("saved_at", r["time"])))
              for r in rows if r["type"] == "mtc.job.checkpoint_saved.v1"
              and r["data"].get("job_id") == job_id]
    return [t1 - t0 for (a0, t0), (a1, t1) in itertools.pairwise(points)
            if a0 == a1 and t1 > t0]


def _signal(ctype: str, details: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario ``signal`` that makes the twin report what the history reported."""
    if ctype == "XidError":
        return {"xid": [int(x) for x in details.get("xids", [])] or [79]}
    if ctype == "EccUncorrectable":
        return {"ecc_dbe": int(details.get("volatile_dbe", 1) or 1)}
    if ctype == "RowRemapFailure":
        return {"row_remap_failure": True}
    if ctype == "DcgmDiagFailed":
        return {"dcgm_level": int(details.get("level", 3))}
    if ctype == "DiskPressure":
        return {"disk_used": float(details.get("used_fraction", 0.99))}
    if ctype == "ThermalThrottling":
        return {"thermal_c": float(details.get("temperature_c", 95.0))}
    return {"heartbeat_lost": True}


def _fixes(faults: Sequence[tuple[float, str, str, Mapping[str, Any]]],
           node_events: Mapping[str, list[tuple[float, str, str]]],
           fault_times: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """How often each action was the one that fixed the node: the last before it returned.
    A chain in which a repair itself failed (``ok=false``) escalated for that reason, not for
    the fault's: it is left out (censored) unless every chain is such."""
    counts: dict[str, int] = defaultdict(int)
    censored: dict[str, int] = defaultdict(int)
    for since, node, _, _ in faults:
        last, broken = "none", False
        later = min((t for t in fault_times.get(node, ()) if t > since), default=math.inf)
        for t, kind, action in node_events.get(node, []):
            if t < since:
                continue
            if last == "none" and t >= later:
                break  # another fault came before any repair: this one needed none
            if kind == "repair":
                last = action
            elif kind == "failed":
                broken = True
            elif kind == "retired":
                last = "replace"
                break
            elif kind == "returned":
                break
        (censored if broken else counts)[last] += 1
    counts = counts or censored
    total = sum(counts.values())
    return {k: round(v / total, 4) for k, v in sorted(counts.items())}
