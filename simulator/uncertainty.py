"""Results with their spread: the uncertain recovery inputs drawn from their stated ranges.

A tiered scenario's recovery costs are not known to a point: the durable tier's share of the
storage fabric, the warm start of each mode, the communicator rebuild, the largest rank, the
copies' interference, the fallbacks and the restart loops each have a range (:data:`RANGES`,
every one with its source or marked assumed). ``--uncertainty N`` draws ``N`` points of that
box (Latin hypercube: one draw in each of ``N`` equal strata of every input, strata paired at
random; ``equal``: the strata's midpoints, paired at random; both seeded) and runs the scenario
at each. Every draw runs the same replication seeds, so the draws see the same failures
(common random numbers): the band is the inputs' spread, and the replication noise (the
spread over seeds at one draw) is reported beside it, not mixed in.

Three cases on the same draws: ``realistic`` (the drawn costs, the scenario's tiers and
modes), ``durable`` (the same draws with durable storage alone: a requeue from it), and
``best`` (every input at its best end: the figures before these costs were modelled).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.sweep import Task

SAMPLINGS = ("lhs", "equal")
CASES = ("realistic", "best", "durable")
METRICS = ("ettr", "goodput")
DEFAULT_DRAWS = 10


@dataclass(frozen=True)
class Uncertain:
    """One uncertain input: a ``--set`` key, its range, its best-case value, and why."""

    key: str
    low: float
    high: float
    best: float
    source: str


# The ranges and their sources (docs/simulator.md, "Results with their spread").
RANGES: tuple[Uncertain, ...] = (
    Uncertain("recovery.durable_gb_s", 320.0, 2000.0, 2000.0,
              "Tectonic's sustained 2 TB/s (Llama 3, arXiv 2407.21783) down to 16% of it, the "
              "share of peak write a 504-GPU production report measured (arXiv 2605.09370)"),
    Uncertain("recovery.startup_warm", 15.0, 60.0, 60.0,
              "assumed; DeadPool resumes in < 40 s at <= 512 A100"),
    Uncertain("recovery.startup_hot_swap", 30.0, 120.0, 60.0,
              "assumed; HyperPod 'under 2 minutes' (vendor)"),
    Uncertain("recovery.startup_scale_down", 45.0, 150.0, 60.0,
              "assumed; FlashRecovery 150 s at 4,800 devices (arXiv 2509.03047)"),
    Uncertain("recovery.rebuild_s_per_kgpu", 1.0, 4.0, 0.0,
              "'tens of seconds at 10k+ GPUs' for teardown and NCCL rebuild (17-67 s at "
              "16,640 GPUs); slope assumed"),
    Uncertain("recovery.largest_rank_gb", 0.35, 4.0, 0.0,
              "the mean shard (346 MB) up to Llama 3's largest, 4 GB per GPU"),
    Uncertain("recovery.copy_interference", 0.0, 0.25, 0.0, "assumed"),
    Uncertain("recovery.fallback_probability", 0.0, 0.15, 0.0,
              "assumed (Megatron-LM#5281: a bad local restore, 44 restarts)"),
    Uncertain("recovery.recur_probability", 0.0, 0.4, 0.0, "assumed"),
)


def draws(n: int, sampling: str, seed: int,
          ranges: Sequence[Uncertain] = RANGES) -> list[dict[str, float]]:
    """``n`` points of the box, one per row: each input takes one value in each of its
    ``n`` equal strata (a random point in it for ``lhs``, its midpoint for ``equal``), the
    strata of different inputs paired by seeded random permutations."""
    if n < 1:
        raise ValueError("--uncertainty needs at least 1 draw")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    rng = np.random.default_rng([seed, 0x5EED])
    columns: list[list[float]] = []
    for spec in ranges:
        strata = rng.permutation(n)
        offset = rng.random(n) if sampling == "lhs" else np.full(n, 0.5)
        u = (strata + offset) / n
        columns.append([spec.low + float(x) * (spec.high - spec.low) for x in u])
    return [{spec.key: columns[j][i] for j, spec in enumerate(ranges)} for i in range(n)]


def best_case(ranges: Sequence[Uncertain] = RANGES) -> dict[str, float]:
    return {spec.key: spec.best for spec in ranges}


def tasks(scenario: str | None, fixed: Mapping[str, Any], point: tuple[tuple[str, str], ...],
          points: Sequence[Mapping[str, float]], replications: int, seed: int
          ) -> list[Task]:
    """The runs of one grid point: each case at each draw (best: once) x the replications,
    replication ``r`` with seed ``seed + r`` in every case and draw. A key set by hand
    (``fixed``, or varied in ``point``) is not drawn."""
    held = set(fixed) | {k for k, _ in point}
    base = tuple(fixed.items()) + tuple(point_overrides(point))
    out: list[Task] = []

    def add(case: str, d: int, values: Mapping[str, Any]) -> None:
        drawn = tuple((k, v) for k, v in values.items() if k not in held)
        for r in range(replications):
            out.append(Task(scenario, base + drawn, (*point, ("case", case), ("draw", str(d))),
                            r, seed + r))

    for d, values in enumerate(points):
        add("realistic", d, values)
        add("durable", d, {**values, "recovery.tiers": "durable"})
    add("best", 0, best_case())
    return out


def point_overrides(point: tuple[tuple[str, str], ...]) -> list[tuple[str, Any]]:
    from simulator.overrides import parse_value

    return [(k, parse_value(v)) for k, v in point]


def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case and metric: the median over the draws of each draw's mean (the central
    value), the lowest and highest draw (the band), and the replication noise (the mean
    over draws of the standard deviation over seeds; None with one replication)."""
    out: dict[str, dict[str, Any]] = {}
    for case in CASES:
        mine = [r for r in rows if r.get("case") == case and r.get("status") == "ok"]
        by_draw: dict[str, list[Mapping[str, Any]]] = {}
        for row in mine:
            by_draw.setdefault(str(row["draw"]), []).append(row)
        if not by_draw:
            continue
        entry: dict[str, Any] = {"draws": len(by_draw),
                                 "replications": max(len(v) for v in by_draw.values())}
        for metric in METRICS:
            means = [statistics.fmean(float(r[metric]) for r in group)
                     for group in by_draw.values()]
            sds = [statistics.stdev(float(r[metric]) for r in group)
                   for group in by_draw.values() if len(group) > 1]
            entry[metric] = {"central": statistics.median(means), "low": min(means),
                             "high": max(means),
                             "noise_sd": statistics.fmean(sds) if sds else None}
        out[case] = entry
    return out


def lines(summary: Mapping[str, Mapping[str, Any]], title: str) -> list[str]:
    """The band, the best case and durable-only as plain lines."""
    out = [title]
    labels = {"realistic": "realistic costs (tiers + modes)",
              "best": "best case (every input at its best end)",
              "durable": "durable only + requeue, same draws"}
    for case in ("realistic", "best", "durable"):
        entry = summary.get(case)
        if entry is None:
            continue
        parts = []
        for metric in METRICS:
            m = entry[metric]
            noise = m["noise_sd"]
            band = "" if case == "best" else f" [{m['low']:.1%}, {m['high']:.1%}]"
            parts.append(f"{metric} {m['central']:.1%}{band}"
                         + (f" (replication sd {noise:.2%})" if noise is not None else ""))
        draws_txt = "" if case == "best" else f"; {entry['draws']} draws"
        out.append(f"{labels[case]}: {'; '.join(parts)}{draws_txt}, "
                   f"{entry['replications']} replication(s)")
    if all(e[m]["noise_sd"] is None for e in summary.values() for m in METRICS):
        out.append("one replication per draw: every draw sees the same failures (common "
                   "random numbers), so the band is the inputs' alone; --replications "
                   "measures the noise")
    return out
