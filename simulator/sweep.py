"""What-if sweeps: a grid of scenario overrides x replications, on every core.

Replication ``r`` of every grid point uses seed ``base + r``: the grid points see the same
random failures (common random numbers: every node's faults come from a stream keyed by the
seed and the node, see ``simulator.streams.Streams``), so their differences are not sampling
noise. Each run has a wall-clock limit (``timeout_s``): a run past it is reported as timed out
(``status``), as is one whose simulated clock wedged (``WedgedClock``), left out of the means
and counted (``failed``), instead of holding a worker and its memory for ever.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import multiprocessing
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator import team_queues
from simulator.goodput import Badput
from simulator.launches import WedgedClock
from simulator.overrides import parse_value
from simulator.scenario import ScenarioError, duration, load_scenario
from simulator.stats import error_bars, mean_ci

# a scenario with team queues adds these per team (``simulator.team_queues``): <name>_<team>
TEAM_METRICS = ("goodput_", "waiting_h_", "preemption_h_")
METRICS = ("goodput", "ettr", "scheduling_goodput", "runtime_goodput", "program_goodput",
           "interruptions", "restarts", "waiting_h", "recovery_h", "wasted_h", "save_h",
           "startup_restore_h", "replacements", "events", "node_h", "useful_gpu_h", "cost",
           "cost_per_useful_gpu_h", "preemptions", "queue_wait_h", "wall_s")


DEFAULT_RUN_TIMEOUT_S = 1800.0  # wall-clock seconds one run may take (0: no limit)


@dataclass(frozen=True)
class Task:
    scenario: str | None
    overrides: tuple[tuple[str, Any], ...]
    point: tuple[tuple[str, str], ...]  # the varied values, as written
    replication: int
    seed: int
    timeout_s: float = DEFAULT_RUN_TIMEOUT_S


class RunTimedOut(BaseException):
    """One run went past its wall-clock limit. A BaseException (like KeyboardInterrupt), so
    that the handlers' and the bus's ``except Exception`` (a transient error: redeliver) do
    not swallow it wherever in the run the alarm strikes."""


@contextmanager
def wall_clock_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`RunTimedOut` in this thread after ``seconds`` of wall time (SIGALRM:
    the main thread of a process, as in a sweep's worker; elsewhere no limit)."""
    usable = (seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise RunTimedOut(f"run took more than {seconds:g} s of wall time")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def parse_vary(specs: Sequence[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise ScenarioError(f"--vary {spec}", "must look like key=v1,v2,...")
        out.append((key.strip(), [v.strip() for v in values.split(",") if v.strip()]))
    return out


def grid(vary: Sequence[tuple[str, list[str]]]) -> list[tuple[tuple[str, str], ...]]:
    keys = [k for k, _ in vary]
    return [tuple(zip(keys, combo, strict=True))
            for combo in itertools.product(*[v for _, v in vary])]


def tasks(scenario: str | None, vary: Sequence[tuple[str, list[str]]], replications: int,
          base_seed: int, fixed: Mapping[str, Any] | None = None,
          timeout_s: float = DEFAULT_RUN_TIMEOUT_S) -> list[Task]:
    out = []
    for point in grid(vary):
        overrides = tuple((fixed or {}).items()) + tuple((k, parse_value(v)) for k, v in point)
        for r in range(replications):
            out.append(Task(scenario, overrides, point, r, base_seed + r, timeout_s))
    return out


def validate(task: Task) -> None:
    """Parse the scenario of one task in this process, so a bad key fails before the pool."""
    load_scenario(task.scenario, dict(task.overrides))


def run_task(task: Task) -> dict[str, Any]:
    from simulator import twin

    scenario = load_scenario(task.scenario, dict(task.overrides))
    t0 = time.perf_counter()
    try:
        with wall_clock_limit(task.timeout_s):
            result = twin.run(scenario, seed=task.seed)
    except (RunTimedOut, WedgedClock) as exc:
        status = "timed_out" if isinstance(exc, RunTimedOut) else "wedged"
        row_out: dict[str, Any] = {k: v for k, v in task.point}
        row_out.update(replication=task.replication, seed=task.seed, status=status)
        row_out.update({m: math.nan for m in METRICS})
        row_out["wall_s"] = time.perf_counter() - t0
        return row_out
    wall = time.perf_counter() - t0
    jobs = list(result.accounting.jobs.values())
    total = sum(j.total_s for j in jobs) or 1.0

    def weighted(attr: str) -> float:
        return float(sum(getattr(j, attr) * j.total_s for j in jobs) / total)

    def lost(*cats: Badput) -> float:
        return sum(j.lost(c) for j in jobs for c in cats) / 3600.0

    row: dict[str, Any] = {k: v for k, v in task.point}
    row.update(replication=task.replication, seed=task.seed, status="ok",
               goodput=weighted("goodput"), ettr=weighted("ettr"),
               scheduling_goodput=weighted("scheduling_goodput"),
               runtime_goodput=weighted("runtime_goodput"),
               program_goodput=weighted("program_goodput"),
               interruptions=sum(result.interruptions.values()),
               restarts=sum(result.restarts.values()),
               waiting_h=lost(Badput.WAITING_FOR_CAPACITY),
               recovery_h=lost(Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION),
               wasted_h=lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION),
               save_h=lost(Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME),
               startup_restore_h=lost(Badput.PROGRAM_STARTUP,
                                      Badput.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME),
               replacements=result.repairs.get("replace", 0), events=result.events,
               **_cost_columns(result.cost), wall_s=wall)
    for team, fig in team_queues.team_figures(scenario.jobs, result.accounting.jobs).items():
        if scenario.cluster.queues:  # per team columns: goodput_<team>, waiting_h_<team>
            row.update({f"{k}_{team}": v for k, v in fig.items()})
    if result.rollout is not None:  # (a scenario with a rollout: how it went, how long)
        row.update(rollout_state=result.rollout["state"], rollout_h=result.rollout["hours"])
    return row


def _cost_columns(cost: Mapping[str, Any]) -> dict[str, float | None]:
    """The run's cost figures (None where unknown: no price in the scenario)."""
    def known(key: str) -> float | None:
        value = cost.get(key)
        return None if value is None else float(value)

    return {"node_h": known("node_hours"), "useful_gpu_h": known("useful_gpu_hours"),
            "cost": known("cost"), "cost_per_useful_gpu_h": known("cost_per_useful_gpu_hour"),
            "preemptions": known("preemptions"), "queue_wait_h": known("queue_wait_h")}


def run_sweep(all_tasks: Sequence[Task], *, processes: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    if not all_tasks:
        return []
    validate(all_tasks[0])
    processes = max(1, min(processes or os.cpu_count() or 1, len(all_tasks)))
    if processes == 1:
        rows: list[dict[str, Any]] = []
        for i, task in enumerate(all_tasks):
            rows.append(run_task(task))
            if progress:
                progress(i + 1, len(all_tasks))
        return rows
    ctx = multiprocessing.get_context("fork" if "fork" in
                                      multiprocessing.get_all_start_methods() else "spawn")
    indexed: list[tuple[int, dict[str, Any]]] = []
    with ctx.Pool(processes) as pool:
        for i, pair in enumerate(pool.imap_unordered(_run_indexed, enumerate(all_tasks))):
            indexed.append(pair)
            if progress:
                progress(i + 1, len(all_tasks))
    # task order (the grid as written, then replication), whichever worker finished first:
    # numeric values keep their order (a sort on strings put 14003 before 1750)
    return [row for _, row in sorted(indexed, key=lambda pair: pair[0])]


def _run_indexed(item: tuple[int, Task]) -> tuple[int, dict[str, Any]]:
    return item[0], run_task(item[1])


def value_key(value: Any) -> tuple[int, float, str]:
    """Sort a varied value as what it means: numbers and durations by size (1750 before
    14003, 90s before 15m), anything else after them, as text."""
    text_ = str(value)
    try:
        return (0, float(text_), text_)
    except ValueError:
        pass
    try:
        return (0, duration(text_, "value"), text_)
    except ScenarioError:
        return (1, 0.0, text_)


def point_key(row: Mapping[str, Any], keys: Sequence[str]) -> list[tuple[int, float, str]]:
    return [value_key(row[k]) for k in keys]


def aggregate(rows: Sequence[Mapping[str, Any]], keys: Sequence[str],
              confidence: float = 0.95) -> list[dict[str, Any]]:
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
    order: list[tuple[str, ...]] = []
    for row in rows:
        key = tuple(str(row[k]) for k in keys)
        if key not in groups:
            order.append(key)
        groups[key].append(row)
    order.sort(key=lambda k: [value_key(v) for v in k])
    out = []
    for key in order:
        group = [r for r in groups[key] if r.get("status", "ok") == "ok"]
        agg: dict[str, Any] = dict(zip(keys, key, strict=True))
        agg["n"] = len(group)
        agg["failed"] = len(groups[key]) - len(group)  # timed out or wedged
        teams = sorted({k for r in group for k in r if k.startswith(TEAM_METRICS)})
        for metric in (*METRICS, *teams):
            # unknown (None) values are left out; none known: NaN
            mean, half, sd = mean_ci((r[metric] for r in group if r.get(metric) is not None),
                                     confidence)
            agg[metric] = mean
            agg[f"{metric}_ci"] = half
            agg[f"{metric}_sd"] = sd
        out.append(agg)
    return out


def write_results(out_dir: Path, rows: Sequence[Mapping[str, Any]],
                  summary: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in (("runs.csv", rows), ("summary.csv", summary)):
        path = out_dir / name
        with path.open("w", newline="") as fh:
            if data:
                writer = csv.DictWriter(fh, fieldnames=list(data[0].keys()))
                writer.writeheader()
                writer.writerows(data)
        paths.append(path)
    path = out_dir / "summary.json"
    everything = {"meta": meta, "summary": [_no_nan(r) for r in summary],
                  "runs": [_no_nan(r) for r in rows]}
    path.write_text(json.dumps(everything, indent=1, default=str, allow_nan=False))
    paths.append(path)
    return paths


def _no_nan(row: Mapping[str, Any]) -> dict[str, Any]:
    """NaN (no value: one replication's CI, an unknown cost) as JSON null, not ``NaN``."""
    return {k: None if isinstance(v, float) and v != v else v for k, v in row.items()}


def _numeric(values: Sequence[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        pass
    try:
        return [duration(v, "value") / 60.0 for v in values]
    except ScenarioError:
        return None


def plot_sweep(out_dir: Path, summary: Sequence[Mapping[str, Any]],
               vary: Sequence[tuple[str, list[str]]],
               metrics: Sequence[str] = ("goodput", "ettr")) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    keys = [k for k, _ in vary]
    for key, values in vary:
        others = [k for k in keys if k != key]
        xs_num = _numeric(values)
        is_duration = xs_num is not None and any(not _is_number(v) for v in values)
        fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4),
                                 squeeze=False)
        series: dict[tuple[str, ...], list[Mapping[str, Any]]] = defaultdict(list)
        for row in summary:
            series[tuple(str(row[k]) for k in others)].append(row)
        for ax, metric in zip(axes[0], metrics, strict=True):
            for label, group in series.items():
                by_value = {str(r[key]): r for r in group}
                pts = [(i, v) for i, v in enumerate(values) if v in by_value]
                x = [xs_num[i] if xs_num is not None else i for i, _ in pts]
                y = [by_value[v][metric] for _, v in pts]
                err = error_bars(y, [by_value[v][f"{metric}_ci"] for _, v in pts], metric)
                name = ", ".join(f"{k}={v}" for k, v in zip(others, label, strict=True))
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=name or metric)
            if xs_num is None:
                ax.set_xticks(range(len(values)), values)
            ax.set_xlabel(f"{key} (minutes)" if is_duration else key)
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            if others:
                ax.legend(fontsize=7)
        fig.suptitle(f"{', '.join(metrics)} vs {key} (mean, 95% CI)")
        fig.tight_layout()
        path = out_dir / f"sweep_{key.replace('.', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
