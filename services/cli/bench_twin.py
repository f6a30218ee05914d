"""Play a fault trace against the twin: the same faults at the same times, the same scoring.

The trace becomes a small scenario (its nodes and spares, one job of its shape, no random
faults) whose faults are the twin's *scripted* faults (``failures.scripted``: a time and a
node slot), one cause per fault kind (``simulator.bench_costs``, which builds the scenario).
The job's costs (startup per mode, restore per tier, save, detection) and the recovery
policy's inputs default to round figures of the embedded default and are the live run's,
fitted, when it ran first (``costs``), so the twin answers "what would the control plane do
with these costs". The twin takes no "wait until resumed", so faults are placed one
at a time: the scenario is run with the faults so far, and the next one goes at its time or,
as live, half a durable interval after the job resumed from the one before (after its first
checkpoint for the first fault), whichever is later; each run takes a fraction of a second
and the same seed gives the same prefix. ``after_step`` becomes a time at the nominal pace.
A ``no_spare_elastic`` fault first takes every idle node out (a
scripted fault on each, repaired only after the benchmark's horizon).
"""

from __future__ import annotations

import re
from typing import Any

from shared.resilience.score import Injected, RunScore, score_run
from shared.resilience.trace import Fault, FaultKind, Trace
from simulator.bench_costs import JOB, SPARE_OUT, RecoveryCosts, scenario
from simulator.clock import EPOCH_S
from simulator.scenario import parse_scenario
from simulator.twin import run as run_twin

SLOT = re.compile(r"-(\d+)$")
# the idle nodes go just before a no-spare fault, as live (drained at its injection): earlier,
# a node back from an earlier fault's repair in between would be a spare again
SPARE_OUT_LEAD_S = 0.1


def _run(trace: Trace, faults: list[dict[str, Any]], costs: RecoveryCosts,
         horizon_s: float, pin: str | None = None) -> Any:
    return run_twin(parse_scenario(scenario(trace, faults, costs, horizon_s, pin),
                                   source="bench"))


def _started(rows: list[dict[str, Any]]) -> list[tuple[float, tuple[str, ...]]]:
    return [(float(r["time"]) - EPOCH_S, tuple(r["data"]["node_ids"])) for r in rows
            if r["type"] == "mtc.job.started.v1" and r["data"].get("job_id") == JOB]


def _resumed_at(rows: list[dict[str, Any]], after: float) -> float | None:
    """Simulated time of the job's first progress (its first step, or a checkpoint) from an
    attempt started after ``after``."""
    starts = [t for t, _ in _started(rows) if t > after]
    if not starts:
        return None
    seen = [float(r["data"]["saved_at"]) - EPOCH_S for r in rows
            if r["type"] == "mtc.job.checkpoint_saved.v1" and r["data"].get("job_id") == JOB]
    seen += [float(r["time"]) - EPOCH_S for r in rows
             if r["type"] == "mtc.job.first_step.v1" and r["data"].get("job_id") == JOB]
    return min((t for t in seen if t > starts[0]), default=None)


def _slot(node_id: str, fault: Fault, nodes: tuple[str, ...]) -> int:
    name = fault.node if fault.node is not None else nodes[(fault.rank or 0) % len(nodes)]
    match = SLOT.search(name)
    return int(match.group(1)) if match else (fault.rank or 0)


def run(trace: Trace, *, costs: RecoveryCosts | None = None,
        pin: str | None = None) -> RunScore:
    """The trace in the twin. ``pin`` (a recovery mode) is the run's label and, on a job with
    tiers or elasticity, the mode the recovery block pins."""
    costs = costs or RecoveryCosts()
    j = trace.job
    horizon = 60.0 + sum((f.at_s or 0.0) for f in trace.faults[-1:]) \
        + len(trace.faults) * (costs.startup_s + trace.repair_s + 10.0)
    scripted: list[dict[str, Any]] = []
    placed: list[tuple[int, Fault, float, str]] = []
    result = _run(trace, scripted, costs, horizon, pin)
    for index, fault in enumerate(trace.faults):
        starts = _started(result.rows)
        if not starts:
            break
        t0 = starts[0][0]
        at = t0 + (fault.at_s if fault.at_s is not None
                   else costs.startup_s + (fault.after_step or 0) * j.step_time_s)
        # as live: not before the job's first checkpoint, nor before it resumed from the last
        resumed = _resumed_at(result.rows, placed[-1][2] if placed else t0 - 1.0)
        if resumed is None:
            break
        at = max(at, resumed + j.checkpoint_every * j.step_time_s / 2)
        nodes = max((s for s in starts if s[0] <= at), key=lambda s: s[0])[1]
        slot = _slot("", fault, nodes)
        if fault.kind is FaultKind.NO_SPARE_ELASTIC:
            busy = {_slot(n, Fault(fault.kind, 0, None, None, n), nodes) for n in nodes}
            for idle in range(trace.nodes + trace.spares):
                if idle not in busy:
                    scripted.append({"at": max(0.0, at - SPARE_OUT_LEAD_S - result.ready_at),
                                     "node": idle, "cause": SPARE_OUT})
        scripted.append({"at": at - result.ready_at, "node": slot, "cause": fault.kind.value})
        placed.append((index, fault, at, nodes[(fault.rank or 0) % len(nodes)]))
        result = _run(trace, scripted, costs, horizon, pin)
    injected = [Injected(i, f.kind.value, EPOCH_S + at, node, f.rank)
                for i, f, at, node in placed]
    # the run ends shortly after the job resumed from the last fault, as a live run does
    last = _resumed_at(result.rows, placed[-1][2]) if placed else None
    end = EPOCH_S + (last + 2.0 if last is not None else horizon)
    rows = [r for r in result.rows if float(r["time"]) <= end]
    return score_run(rows, JOB, injected, label=pin or "chosen", target="twin",
                     nodes=j.replicas, end=end)


MODE_FIELDS = {"requeue": "startup_s", "in_place": "startup_in_place_s",
               "hot_swap": "startup_hot_swap_s", "scale_down": "startup_scale_down_s"}


def calibrate(trace: Trace, costs: RecoveryCosts, live: RunScore) -> RecoveryCosts:
    """``costs`` with each mode's startup moved by the median of (live less twin)
    fault-to-resumed over the incidents both recovered by that mode: the fit takes the
    detection out of the live time, but the twin's own stop (drain, save, exit) and launch
    are its own, so one twin run measures them. Modes the twin did not choose as live did
    keep their fitted startup."""
    from dataclasses import replace
    from statistics import median

    twin = run(trace, costs=costs)
    theirs = {i.index: i for i in twin.incidents}
    deltas: dict[str, list[float]] = {}
    for mine in live.incidents:
        o = theirs.get(mine.index)
        if o is None or o.mode != mine.mode or mine.recovered_s is None \
                or o.recovered_s is None or mine.mode not in MODE_FIELDS:
            continue
        deltas.setdefault(mine.mode, []).append(mine.recovered_s - o.recovered_s)
    moved: dict[str, float] = {}
    for mode, values in deltas.items():
        moved[MODE_FIELDS[mode]] = max(0.001, costs.warm(mode) + median(values))
    fitted = {**costs.fitted, "calibrated": sorted(moved)}
    return replace(costs, fitted=fitted,
                   startup_s=moved.get("startup_s", costs.startup_s),
                   startup_in_place_s=moved.get("startup_in_place_s", costs.startup_in_place_s),
                   startup_hot_swap_s=moved.get("startup_hot_swap_s", costs.startup_hot_swap_s),
                   startup_scale_down_s=moved.get("startup_scale_down_s",
                                                  costs.startup_scale_down_s))
