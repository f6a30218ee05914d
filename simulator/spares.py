"""``mtc sim plan-spares``: the smallest hot-spare count that meets a target, and the curve.

For each candidate spare count the twin runs the scenario ``replications`` times (the same
seeds for every count). Two measures come from each run's event log:

- the wait for a spare: from each requeue of a job (an interruption took a node away) to its
  next start; with a spare ready that is seconds, without one it is a repair. The p95 is taken
  over every wait of every replication of a count;
- the job goodput (scheduling x runtime x program, weighted by the jobs' time) with its 95%
  interval over the replications; the fleet goodput beside it, which the idle spares cost.

A target is either ``p95 wait <= T`` or ``mean goodput >= G``; the answer is the smallest count
that meets it (None when no count tried does). The curve is written as a PNG (matplotlib).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.scenario import load_scenario
from simulator.stats import error_bars, interval_text, mean_ci

__all__ = ["Plan", "Point", "default_counts", "p95", "plan_spares", "plot", "spare_waits"]


def spare_waits(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """Seconds from each requeue of a job to its next start (an unanswered one: to the end)."""
    pending: dict[str, float] = {}
    waits: list[float] = []
    end = float(rows[-1]["time"]) if rows else 0.0
    for r in rows:
        job = r["data"].get("job_id")
        if r["type"] == "mtc.job.requeued.v1":
            pending.setdefault(job, float(r["time"]))
        elif r["type"] == "mtc.job.started.v1" and job in pending:
            waits.append(float(r["time"]) - pending.pop(job))
    waits.extend(end - t for t in pending.values())
    return waits


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank); 0 with no values (no wait was ever needed)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Point:
    spares: int
    waits: int
    p95_wait_s: float
    goodput: float
    goodput_ci: float
    fleet_goodput: float
    meets: bool

    def as_dict(self) -> dict[str, Any]:
        return {"spares": self.spares, "waits": self.waits, "p95_wait_s": self.p95_wait_s,
                "goodput": self.goodput, "goodput_ci": self.goodput_ci,
                "fleet_goodput": self.fleet_goodput, "meets": self.meets}


@dataclass(frozen=True)
class Plan:
    target: str
    replications: int
    points: tuple[Point, ...]
    best: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "replications": self.replications, "best": self.best,
                "points": [p.as_dict() for p in self.points]}

    def lines(self) -> list[str]:
        out = [f"target: {self.target}; {self.replications} replications per spare count"]
        for p in self.points:
            good = interval_text(p.goodput, p.goodput_ci, "goodput", self.replications, 4)
            out.append(f"  spares {p.spares}: p95 wait {p.p95_wait_s / 60:.1f} min "
                       f"({p.waits} waits), job goodput {good}, fleet goodput "
                       f"{p.fleet_goodput:.4f}{'  <- meets' if p.meets else ''}")
        out.append(f"smallest spare count that meets it: {self.best}" if self.best is not None
                   else "no spare count tried meets it")
        return out


def _run(scenario: str | Path | None, overrides: Mapping[str, Any], spares: int,
         seed: int) -> tuple[list[float], float, float]:
    from simulator import twin

    sc = load_scenario(scenario, {**overrides, "spares": spares})
    result = twin.run(sc, seed=seed)
    jobs = list(result.accounting.jobs.values())
    total = sum(j.total_s for j in jobs) or 1.0
    goodput = sum(j.goodput * j.total_s for j in jobs) / total
    return spare_waits(result.rows), goodput, result.accounting.fleet.goodput


def plan_spares(scenario: str | Path | None, counts: Sequence[int], *, replications: int = 5,
                seed: int = 1, max_p95_wait_s: float | None = None,
                min_goodput: float | None = None,
                overrides: Mapping[str, Any] | None = None,
                progress: Callable[[int, int, int], None] | None = None) -> Plan:
    """Run every count (ascending) ``replications`` times; the smallest meeting the target.
    ``progress(done, total, spares)`` is called after each run (the CLI's progress lines)."""
    if (max_p95_wait_s is None) == (min_goodput is None):
        raise ValueError("give exactly one target: a p95 wait or a goodput floor")
    if replications < 1 or not counts or min(counts) < 0:
        raise ValueError("need replications >= 1 and spare counts >= 0")
    target = (f"p95 wait for a spare <= {max_p95_wait_s / 60:g} min"
              if max_p95_wait_s is not None else f"job goodput >= {min_goodput:g}")
    points = []
    total, done = len(set(counts)) * replications, 0
    for k in sorted(set(counts)):
        waits: list[float] = []
        goodputs, fleet = [], []
        for r in range(replications):
            w, g, f = _run(scenario, overrides or {}, k, seed + r)
            done += 1
            if progress is not None:
                progress(done, total, k)
            waits += w
            goodputs.append(g)
            fleet.append(f)
        mean, half, _ = mean_ci(goodputs)
        tail = p95(waits)
        meets = tail <= max_p95_wait_s if max_p95_wait_s is not None else mean >= (min_goodput or 0)
        points.append(Point(k, len(waits), tail, mean, half, sum(fleet) / len(fleet), meets))
    best = next((p.spares for p in points if p.meets), None)
    return Plan(target, replications, tuple(points), best)


def default_counts(own: int) -> list[int]:
    """The spare counts tried when none are given: a range around the scenario's own count
    (0, a quarter, half, three quarters, itself, 1.5x and 2x), so the answer can be below or
    above it; the old fixed 0-8 left out a scenario's 32 spares and suggested nothing."""
    if own <= 4:
        return [0, 1, 2, 4, 8]
    return sorted({0, own // 4, own // 2, own * 3 // 4, own, own * 3 // 2, own * 2})


def plot(plan: Plan, path: Path, *, max_p95_wait_s: float | None = None,
         min_goodput: float | None = None) -> Path:
    """The p95 wait and the goodputs against the spare count, the target and the answer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.spares for p in plan.points]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, [p.p95_wait_s / 60 for p in plan.points], "o-", color="tab:red",
            label="p95 wait for a spare")
    ax.set_xticks(xs)
    ax.set_xlabel("hot spares")
    ax.set_ylabel("p95 wait (min)", color="tab:red")
    if max_p95_wait_s is not None:
        ax.axhline(max_p95_wait_s / 60, color="tab:red", ls="--", lw=1, label="target")
    right = ax.twinx()
    right.errorbar(xs, [p.goodput for p in plan.points],
                   yerr=error_bars([p.goodput for p in plan.points],
                                   [p.goodput_ci for p in plan.points], "goodput"),
                   fmt="s-", color="tab:blue", capsize=3,
                   label="job goodput")
    right.plot(xs, [p.fleet_goodput for p in plan.points], "^:", color="tab:gray",
               label="fleet goodput")
    right.set_ylabel("goodput", color="tab:blue")
    if min_goodput is not None:
        right.axhline(min_goodput, color="tab:blue", ls="--", lw=1, label="target")
    if plan.best is not None:
        ax.axvline(plan.best, color="green", lw=1)
    answer = f"{plan.best} spare(s)" if plan.best is not None else "not met"
    ax.set_title(f"{plan.target}: {answer}")
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="center right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
