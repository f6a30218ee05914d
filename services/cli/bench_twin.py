"""Play a fault trace against the twin: the same faults at the same times, the same scoring.

The trace becomes a small scenario (its nodes and spares, one job of its shape, no random
faults) whose faults are the twin's *scripted* faults (``failures.scripted``: a time and a
node slot), one cause per fault kind (:data:`CAUSES`). The job's costs (startup, restore,
save) default to round figures of the embedded default and are replaced by the costs the
live run measured when it ran first (``costs``), so the twin answers "what would the control
plane do with these costs". The twin takes no "wait until resumed", so faults are placed one
at a time: the scenario is run with the faults so far, and the next one goes at its time or,
as live, half a durable interval after the job resumed from the one before (after its first
checkpoint for the first fault), whichever is later; each run takes a fraction of a second
and the same seed gives the same prefix. ``after_step`` becomes a time at the nominal pace.
A ``no_spare_elastic`` fault first takes every idle node out (a
scripted fault on each, repaired only after the benchmark's horizon).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shared.resilience.bench_config import BENCH_REPAIR
from shared.resilience.score import Injected, RunScore, score_run
from shared.resilience.trace import Fault, FaultKind, Trace
from simulator.clock import EPOCH_S
from simulator.scenario import parse_scenario
from simulator.twin import run as run_twin

JOB = "bench"
SPARE_OUT = "spare_out"  # the cause that takes idle nodes out before a no-spare fault
CAUSES: Mapping[str, dict[str, Any]] = {
    FaultKind.APP_CRASH.value: {"signal": "none", "fix": "none", "category": "software"},
    FaultKind.XID_13.value: {"signal": {"xid": [13]}, "fix": "none"},
    FaultKind.XID_79.value: {"signal": {"xid": [79]}, "fix": "reboot"},
    FaultKind.NODE_LOST.value: {"signal": {"heartbeat_lost": True}, "fix": "reboot",
                                "category": "host"},
    FaultKind.NO_SPARE_ELASTIC.value: {"signal": {"xid": [79]}, "fix": "reboot"},
    SPARE_OUT: {"signal": {"xid": [79]}, "fix": "replace"},
}
DEFAULT_COSTS = {"startup_s": 2.0, "restore_s": 0.1, "save_s": 0.01}
SLOT = re.compile(r"-(\d+)$")


def scenario(trace: Trace, faults: list[dict[str, Any]], costs: Mapping[str, float],
             horizon_s: float) -> dict[str, Any]:
    j = trace.job
    return {
        "name": f"bench-{trace.name}", "seed": 1, "duration": horizon_s,
        "checkpoint_events": "all",
        "cluster": {"cluster_id": "bench", "provision": 0.2,
                    "partitions": [{"name": "train", "nodes": trace.nodes,
                                    "spares": trace.spares}]},
        "jobs": [{"name": JOB, "nodes": j.replicas, "step_time": j.step_time_s,
                  "checkpoint_interval": j.checkpoint_every * j.step_time_s,
                  "checkpoint_save": costs["save_s"], "checkpoint_restore": costs["restore_s"],
                  "startup": costs["startup_s"], "crash_exit": 0.5, "hang_exit": 5.0,
                  "launch_fail": 1.0}],
        "failures": {"rate_scale": 0, "lemons": {"fraction": 0.0, "multiplier": 1},
                     "planned": {"per_day": 0}, "stragglers": {"per_1000_node_days": 0},
                     "causes": {k: {**v, "count": 0} for k, v in CAUSES.items()},
                     "scripted": faults},
        "repair": {"durations": {"reset_gpu": min(0.5, trace.repair_s), "reboot": trace.repair_s,
                                 "reimage": trace.repair_s, "replace": 10 * horizon_s},
                   "verify_interval": 0.5},
        "detection": {"xid": 0.1, "heartbeat": {"low": 0.0, "high": 0.5},
                      "report_interval": 5.0},
        "control_plane": {"grace_period": 10.0, "heartbeat_timeout": 2.0,
                          "repair": dict(BENCH_REPAIR)},
    }


def _run(trace: Trace, faults: list[dict[str, Any]], costs: Mapping[str, float],
         horizon_s: float) -> Any:
    return run_twin(parse_scenario(scenario(trace, faults, costs, horizon_s),
                                   source="bench"))


def _started(rows: list[dict[str, Any]]) -> list[tuple[float, tuple[str, ...]]]:
    return [(float(r["time"]) - EPOCH_S, tuple(r["data"]["node_ids"])) for r in rows
            if r["type"] == "mtc.job.started.v1" and r["data"].get("job_id") == JOB]


def _resumed_at(rows: list[dict[str, Any]], after: float) -> float | None:
    """Simulated time of the job's first checkpoint from an attempt started after ``after``."""
    starts = [t for t, _ in _started(rows) if t > after]
    if not starts:
        return None
    return next((float(r["data"]["saved_at"]) - EPOCH_S for r in rows
                 if r["type"] == "mtc.job.checkpoint_saved.v1"
                 and float(r["data"]["saved_at"]) - EPOCH_S > starts[0]), None)


def _slot(node_id: str, fault: Fault, nodes: tuple[str, ...]) -> int:
    name = fault.node if fault.node is not None else nodes[(fault.rank or 0) % len(nodes)]
    match = SLOT.search(name)
    return int(match.group(1)) if match else (fault.rank or 0)


def run(trace: Trace, *, costs: Mapping[str, float] | None = None,
        pin: str | None = None) -> RunScore:
    """The trace in the twin. ``pin`` (a recovery mode) is recorded as the run's label; the
    twin pins it only once it models recovery modes (then through the job's labels)."""
    costs = {**DEFAULT_COSTS, **(costs or {})}
    j = trace.job
    horizon = 60.0 + sum((f.at_s or 0.0) for f in trace.faults[-1:]) \
        + len(trace.faults) * (costs["startup_s"] + trace.repair_s + 10.0)
    scripted: list[dict[str, Any]] = []
    placed: list[tuple[int, Fault, float, str]] = []
    result = _run(trace, scripted, costs, horizon)
    for index, fault in enumerate(trace.faults):
        starts = _started(result.rows)
        if not starts:
            break
        t0 = starts[0][0]
        at = t0 + (fault.at_s if fault.at_s is not None
                   else costs["startup_s"] + (fault.after_step or 0) * j.step_time_s)
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
                    scripted.append({"at": max(0.0, at - 0.5 - result.ready_at),
                                     "node": idle, "cause": SPARE_OUT})
        scripted.append({"at": at - result.ready_at, "node": slot, "cause": fault.kind.value})
        placed.append((index, fault, at, nodes[(fault.rank or 0) % len(nodes)]))
        result = _run(trace, scripted, costs, horizon)
    injected = [Injected(i, f.kind.value, EPOCH_S + at, node, f.rank)
                for i, f, at, node in placed]
    # the run ends shortly after the job resumed from the last fault, as a live run does
    last = _resumed_at(result.rows, placed[-1][2]) if placed else None
    end = EPOCH_S + (last + 2.0 if last is not None else horizon)
    rows = [r for r in result.rows if float(r["time"]) <= end]
    return score_run(rows, JOB, injected, label=pin or "chosen", target="twin",
                     nodes=j.replicas, end=end)
