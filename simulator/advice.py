"""``mtc sim advise``: what following checkpoint_resume's checkpoint advice gains.

The twin runs the scenario as written, ``replications`` times; in each run the real
checkpoint_resume handler keeps, on the job, the interval its observed failure rate and
measured save cost call for (``shared.policies.checkpointing.advise``). The advised interval
is the median of the runs' final advice. Then the twin runs again over the same seeds with
every job checkpointing at the advised interval, as a program that follows ``MTC_ADVICE_FILE``
would from its next start. The report: both intervals, both goodputs and the paired difference
with its 95% interval.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simulator.scenario import load_scenario
from simulator.stats import mean_ci, wide_mark

__all__ = ["follow_advice", "lines"]


def _goodput(result: Any) -> float:
    jobs = list(result.accounting.jobs.values())
    total = sum(j.total_s for j in jobs) or 1.0
    return float(sum(j.goodput * j.total_s for j in jobs) / total)


def _run(scenario: str | Path | None, overrides: Mapping[str, Any],
         seed: int) -> tuple[float, list[float]]:
    """(job goodput, the advised interval of each job that got advice) of one run."""
    from simulator.twin import Twin

    sc = load_scenario(scenario, dict(overrides))
    t = Twin(sc, seed=seed)
    result = t.run()
    with t.deps.uow() as uow:
        advised = [float(j.checkpoint_advice["interval_s"]) for j in uow.jobs.list()
                   if j.checkpoint_advice]
    return _goodput(result), advised


def follow_advice(scenario: str | Path | None, *, replications: int = 5, seed: int = 1,
                  overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Goodput as written and when following the advice, same seeds (see the module doc)."""
    if replications < 2:
        raise ValueError("need at least 2 replications (an interval)")
    fixed = dict(overrides or {})
    sc = load_scenario(scenario, fixed)
    written = [j.checkpoint_interval_s for j in sc.jobs]
    base, advised = [], []
    for r in range(replications):
        g, a = _run(scenario, fixed, seed + r)
        base.append(g)
        advised += a
    if not advised:
        raise ValueError("the control plane gave no advice (no checkpoint had a measured save)")
    interval = statistics.median(advised)
    step = min(j.step_time_s for j in sc.jobs)
    interval = max(interval, step)
    follow = [_run(scenario, {**fixed, "checkpoint_interval": interval}, seed + r)[0]
              for r in range(replications)]
    diff, half, _ = mean_ci([f - b for b, f in zip(base, follow, strict=True)])
    return {"replications": replications, "seeds": [seed + r for r in range(replications)],
            "written_interval_s": written, "advised_interval_s": interval,
            "advised_range_s": [min(advised), max(advised)],
            "goodput_as_written": sum(base) / len(base),
            "goodput_following_advice": sum(follow) / len(follow),
            "gain": diff, "gain_ci": half}


def lines(out: Mapping[str, Any]) -> list[str]:
    """The comparison as plain lines."""
    written = ", ".join(f"{w:.0f} s" for w in out["written_interval_s"])
    lo, hi = out["advised_range_s"]
    return [f"checkpoint interval as written: {written}; advised: {out['advised_interval_s']:.0f}"
            f" s (median of the runs' advice, range {lo:.0f}-{hi:.0f} s)",
            f"job goodput over {out['replications']} replications (same seeds): "
            f"{out['goodput_as_written']:.4f} as written, "
            f"{out['goodput_following_advice']:.4f} following the advice",
            f"gain: {out['gain']:+.4f} ± {out['gain_ci']:.4f} (95%)"
            f"{wide_mark(int(out['replications']))}"]
