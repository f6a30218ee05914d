"""What a fit (:mod:`simulator.fit`) says: its estimates as plain lines, and the scenario
the twin runs from it (``simulator/scenario.py`` format, ready for YAML; what was not
fitted is left at the twin's defaults and said so in its description).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from simulator.fit import DAY_S, Fit


def summary_lines(f: Fit) -> list[str]:
    """The estimates as plain lines (one fact a line: nothing to cut on a narrow terminal)."""
    out = [f"WARNING: {w}" for w in f.warnings]
    out.append(f"{f.nodes} nodes ({f.job_nodes} in the job) over {f.window_s / DAY_S:.2f} "
               f"days: {f.node_days:.1f} node-days up, {f.job_node_days:.1f} in jobs")
    level = f"{100 * f.confidence:g}%"
    out.append(f"failure rates per 1000 node-days ({level} exact Poisson interval):")
    for c in f.causes:
        r = c.per_node_day
        fixes = ", ".join(f"{k} {v:.0%}" for k, v in c.fix.items())
        out.append(f"  {c.name}: {r.value * 1e3:.2f} [{r.low * 1e3:.2f}, {r.high * 1e3:.2f}]"
                   f"  n={c.count} ({c.observed}); fixed by {fixes}")
        for weight, sig, fx in c.variants:
            shown = ", ".join(f"XID {', '.join(map(str, v))}" if k == "xid" else f"{k} {v}"
                              for k, v in sig.items())
            out.append(f"    {weight:.0%} reported as {shown}; fixed by "
                       + ", ".join(f"{k} {v:.0%}" for k, v in fx.items()))
    out.append(f"repairs (lognormal median, sigma; chance the action fails, "
               f"{level} Wilson):")
    for rep in f.repairs:
        out.append(f"  {rep.action}: n={rep.count} median {rep.median_s:.0f} s sigma "
                   f"{rep.sigma:.2f}; fails {rep.failure.value:.1%} "
                   f"[{rep.failure.low:.1%}, {rep.failure.high:.1%}]")
    out.append("detection delays (report time less the fault's since):")
    for kind, (n, median, sigma) in f.detection.items():
        out.append(f"  {kind}: n={n} median {median:.1f} s sigma {sigma:.2f}")
    for job_id, j in f.jobs.items():
        if "step_time_s" not in j:
            out.append(f"job {job_id}: {j['nodes']:.0f} nodes; pace unknown (no two checkpoints"
                       " in one attempt): the twin's defaults")
            continue
        out.append(f"job {job_id}: step {j['step_time_s']:.3f} s, checkpoint every "
                   f"{j['checkpoint_interval_s']:.0f} s, save {j['checkpoint_save_s']:.1f} s, "
                   f"startup {j['startup_s']:.0f} s")
    return out



def _dist(median: float, sigma: float) -> Any:
    return round(median, 3) if sigma < 1e-6 else {"median": round(median, 3),
                                                  "sigma": round(sigma, 4)}


def _fix_spec(fix: Mapping[str, float]) -> Any:
    kept = {k: v for k, v in fix.items() if v > 0}
    return next(iter(kept)) if len(kept) == 1 else kept


def to_scenario(f: Fit, *, name: str = "fitted", source: str = "") -> dict[str, Any]:
    """The fit as a scenario (``simulator/scenario.py`` format), ready for YAML."""
    jobs = []
    for job_id, j in f.jobs.items():
        body: dict[str, Any] = {
            "name": re.sub(r"[^a-z0-9-]", "-", job_id.lower()).strip("-") or "job",
            "nodes": max(1, int(j["nodes"]))}
        if "step_time_s" in j:  # measured; else the twin's defaults
            step = max(j["step_time_s"], 1e-3)
            body.update({"step_time": round(step, 4),
                         "checkpoint_interval": round(max(j["checkpoint_interval_s"], step), 3),
                         "checkpoint_save": round(j["checkpoint_save_s"], 3),
                         "startup": round(j["startup_s"], 3)})
        jobs.append(body)
    causes: dict[str, Any] = {}
    for c in f.causes:
        spec: dict[str, Any] = {"per_1000_node_days": round(c.per_node_day.value * 1000, 6)}
        if c.variants:
            spec["variants"] = [{"weight": w, "signal": dict(sig), "fix": _fix_spec(fx)}
                                for w, sig, fx in c.variants]
        else:
            spec["signal"] = dict(c.signal) if c.signal else "none"
            spec["fix"] = _fix_spec(c.fix)
        if not c.kills_job:
            spec["kills_job"] = False
        causes[re.sub(r"\W", "_", c.name)] = spec
    detection = {k: _dist(m, s) for k, (_, m, s) in f.detection.items()}
    repair = {"durations": {r.action: _dist(r.median_s, r.sigma) for r in f.repairs},
              "mechanical_failure": {r.action: round(r.failure.value, 4) for r in f.repairs}}
    job_nodes = max([j["nodes"] for j in jobs], default=f.job_nodes or f.nodes)
    return {
        "name": name,
        "description": f"Fitted by mtc sim fit from {source or 'an event history'}: "
                       f"{f.nodes} nodes over {f.window_s / DAY_S:.2f} days, "
                       f"{sum(c.count for c in f.causes)} faults. "
                       + "".join(f"WARNING: {w}. " for w in f.warnings)
                       + "Not fitted (defaults): "
                       "lemons, diurnal slowdown, stragglers, planned restarts, the bus.",
        "duration": round(f.window_s, 3),
        "cluster": {"partitions": [{"name": "train", "nodes": int(job_nodes),
                                    "spares": max(0, f.nodes - int(job_nodes))}]},
        "jobs": jobs or [{"nodes": int(job_nodes)}],
        "failures": {"causes": causes},
        "repair": repair,
        "detection": detection,
    }
