"""What a run prints and draws: rich tables and a matplotlib timeline."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from shared.goodput.totals import ETTR_MEANS
from simulator import team_queues
from simulator.clock import EPOCH_S
from simulator.failures import LLAMA3_DAYS, LLAMA3_NODES, LLAMA3_UNEXPECTED
from simulator.goodput import PROGRAM, Badput, JobGoodput
from simulator.layout import Grid, render_all
from simulator.scenario_types import RecoveryCfg
from simulator.stats import FEW_REPLICATIONS, interval_text
from simulator.twin import RunResult

HOUR = 3600.0
DAY = 86_400.0


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def print_run(result: RunResult, console: Console | None = None) -> None:
    """The run's tables on ``console``, boxed where they fit and stacked where they do not
    (:mod:`simulator.layout`): no header or number is ever cut."""
    console = console or Console()
    sc = result.scenario
    console.print(Text(f"{sc.name}: {sc.description}"), highlight=False)
    console.print(Text(f"seed {result.seed}; {sc.cluster.nodes} nodes x "
                       f"{sc.cluster.gpus_per_node} GPUs ({sc.cluster.gpus} GPUs); "
                       f"{sc.duration_s / DAY:g} days after the cluster was ready (bring-up "
                       f"took {result.ready_at / 60:.0f} simulated min)"), highlight=False)
    render_all(console, run_grids(result))
    console.print(Text(ETTR_MEANS), style="dim", highlight=False)


def run_grids(result: RunResult) -> list[Grid]:
    """What ``print_run`` shows, as plain tables of strings."""
    sc = result.scenario
    table = Grid("Goodput per job", ("job", "nodes", "sched", "runtime", "program", "goodput",
                                     "ETTR", "restarts", "state"))
    for name, jg in sorted(result.accounting.jobs.items()):
        table.add(name, jg.params.nodes, _pct(jg.scheduling_goodput),
                  _pct(jg.runtime_goodput), _pct(jg.program_goodput), _pct(jg.goodput),
                  _pct(jg.ettr), result.restarts.get(name, 0),
                  result.job_states.get(name, "").removeprefix("JOB_STATE_"))
    fleet = result.accounting.fleet
    table.add("fleet", sc.cluster.nodes, "", "", "", _pct(fleet.goodput),
              _pct(fleet.utilization), "", "")
    grids = [table]

    grids.append(parts_grid(result))
    if sc.cluster.queues:  # fair share: how each team fared
        teams = Grid("Per team (fair share)", ("team", "goodput", "waiting h",
                                                "preemption h"))
        for team, fig in team_queues.team_figures(sc.jobs, result.accounting.jobs).items():
            teams.add(team, _pct(fig["goodput"]), f"{fig['waiting_h']:.1f}",
                      f"{fig['preemption_h']:.1f}")
        grids.append(teams)

    bad = Grid("Badput by category (job hours, share of job time)",
               ("category", "hours", "share"))
    for name, jg in sorted(result.accounting.jobs.items()):
        total = jg.total_s or 1.0
        for cat, secs in jg.by_category().items():
            if secs > 0:
                bad.add(f"{name}: {cat}", f"{secs / HOUR:.1f}", _pct(secs / total))
    grids.append(bad)

    causes = Grid("Lost job hours by the cause that started them",
                  ("cause", "interruptions", "hours lost"))
    per_cause: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for jg in result.accounting.jobs.values():
        for (cat, cause), secs in jg.badput.items():
            if cat is not Badput.PROGRAM_SLOWDOWN:
                per_cause[cause] += secs
        for cause, n in jg.interruptions().items():
            counts[cause] += n
    for cause, secs in sorted(per_cause.items(), key=lambda kv: -kv[1]):
        causes.add(cause, counts.get(cause, ""), f"{secs / HOUR:.1f}")
    grids.append(causes)

    scale = (sc.cluster.nodes - sum(p.spares for p in sc.cluster.partitions)) \
        * (sc.duration_s / DAY) / (LLAMA3_NODES * LLAMA3_DAYS) * sc.failures.rate_scale
    inter = Grid("Interruptions by root cause (simulated truth)",
                 ("cause", "simulated", f"Llama 3 x {scale:.3g}"))
    for cause, n in sorted(result.interruptions.items(), key=lambda kv: -kv[1]):
        published = LLAMA3_UNEXPECTED.get(cause)
        inter.add(cause, n, f"{published[2] * scale:.1f}" if published else "")
    grids.append(inter)

    other = Grid("Repairs and the run", ("what", "count"))
    for action, n in sorted(result.repairs.items()):
        other.add(f"repair: {action}", n)
    other.add("events delivered", result.events)
    other.add("duplicates / reordered", f"{result.bus['duplicates']} / "
                                        f"{result.bus['reordered']}")
    other.add("dead letters", result.dead_letters)
    t = result.timings
    other.add("wall time (s)", f"{t.wall_s:.2f} (handlers {t.handlers_s:.2f}, "
                               f"accounting {t.accounting_s:.2f}, twin {t.twin_s:.2f})")
    grids.append(other)
    if sc.recovery is not None and sc.recovery.durable_storage is not None:
        grids.append(durable_grid(sc.recovery))
    if sc.availability.explicit:
        grids.append(cost_grid(result.cost))
    return grids


def durable_grid(cfg: RecoveryCfg) -> Grid:
    """The durable tier derived from the cluster's Lustre (``simulator.durable_storage``)."""
    storage = cfg.durable_storage
    assert storage is not None
    state_gb = cfg.parameters * cfg.bytes_per_parameter / 1e9
    restore = cfg.durable_restore_gb_s or cfg.durable_gb_s
    grid = Grid("Durable tier: the cluster's Lustre", ("what", "value"))
    grid.add("tier x capacity", f"{storage.lustre_mb_s_per_tib} MB/s/TiB x "
                                f"{storage.capacity_tib:,.0f} TiB = {storage.peak_gb_s:,.0f} GB/s")
    grid.add("job's share; write / read efficiency",
             f"{storage.job_share:.0%}; {storage.write_efficiency:.0%} / "
             f"{storage.read_efficiency:.0%}")
    grid.add("save / restore bandwidth", f"{cfg.durable_gb_s:,.1f} / {restore:,.1f} GB/s")
    grid.add(f"durable save / restore ({state_gb:,.0f} GB)",
             f"{state_gb / cfg.durable_gb_s:,.1f} s / {state_gb / restore:,.1f} s")
    return grid


def goodput_parts(jg: JobGoodput) -> list[tuple[str, float]]:
    """A job's goodput as parts of its wall time that add up: 100% less each badput category's
    share of the time, less time no category holds, is the productive share (ETTR); less the
    program's gap (MFU below 1, steps slower than nominal: ETTR x (1 - program goodput)) it is
    the goodput. Without the program line a reader sees a badput table adding to ~10% beside
    a goodput of ~36% and cannot tell where the rest went."""
    total = jg.total_s
    if total <= 0:
        return [("job time", 1.0), ("goodput", 0.0)]
    parts: list[tuple[str, float]] = [("job time", 1.0)]
    lost = 0.0
    for cat, secs in jg.by_category().items():
        if secs > 0 and Badput(cat) not in PROGRAM:
            parts.append((f"- {cat}", -secs / total))
            lost += secs / total
    ettr = jg.ettr
    unaccounted = 1.0 - lost - ettr
    if abs(unaccounted) >= 5e-4:
        parts.append(("- time no category holds", -unaccounted))
    parts.append(("= productive (ETTR)", ettr))
    parts.append(("- program (MFU, slow steps)", -(ettr - jg.goodput)))
    parts.append(("= goodput", jg.goodput))
    return parts


def parts_grid(result: RunResult) -> Grid:
    """Each job's :func:`goodput_parts` as one table."""
    grid = Grid("Where each job's time went (the lines add up to its goodput)",
                ("job: part", "share of job time"))
    for name, jg in sorted(result.accounting.jobs.items()):
        for label, share in goodput_parts(jg):
            grid.add(f"{name}: {label}", f"{100.0 * abs(share):.1f}%")
    return grid


def cost_grid(cost: Mapping[str, Any]) -> Grid:
    """Capacity and its cost beside the goodput: ``unknown`` where the scenario names no
    price."""
    def money(key: str, digits: int = 2) -> str:
        value = cost.get(key)
        return "unknown" if value is None else f"{value:,.{digits}f}"

    grid = Grid(f"Capacity and cost ({cost['mode']})", ("what", "value"))
    grid.add("price per node-hour", money("price_per_node_hour"))
    grid.add("node-hours billed (spares incl.)", f"{cost['node_hours']:,.1f}")
    grid.add("cost", money("cost", 0))
    grid.add("useful GPU-hours (productive)", f"{cost['useful_gpu_hours']:,.1f}")
    grid.add("cost per useful GPU-hour", money("cost_per_useful_gpu_hour", 3))
    if cost["mode"] == "spot":
        grid.add("preemptions (with a job on the node)",
                 f"{cost['preemptions']} ({cost['with_job']})")
        grid.add("jobs caught before their save", cost["job_lost_progress"])
    if cost["mode"] == "queued":
        grid.add("queue wait, hours (requests)",
                 f"{cost['queue_wait_h']:.2f} ({cost['queue_waits']})")
    return grid


# ---------------------------------------------------------------- plots


def _out_of_service(rows: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[int]]:
    out: set[str] = set()
    times: list[float] = []
    counts: list[int] = []
    for row in rows:
        type_ = row["type"]
        data = row["data"]
        changed = True
        if type_ in ("mtc.node.draining.v1", "mtc.node.repair_started.v1",
                     "mtc.node.drained.v1"):
            out.add(data["node_id"])
        elif type_ == "mtc.node.returned_to_service.v1":
            out.discard(data["node_id"])
        elif type_ == "mtc.node.retired.v1":
            out.discard(data["node_id"])
            if data.get("replacement_id"):
                out.add(data["replacement_id"])
        else:
            changed = False
        if changed:
            times.append(float(row["time"]))
            counts.append(len(out))
    return times, counts


def plot_timeline(result: RunResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = EPOCH_S + result.ready_at
    days = result.scenario.duration_s / DAY
    fig, axes = plt.subplots(3, 1, figsize=(12, 8), sharex=True,
                             gridspec_kw={"height_ratios": [2, 2, 1.3]})
    ax = axes[0]
    for job in result.scenario.jobs:
        pts = sorted((float(r["data"]["saved_at"]), int(r["data"]["step"]))
                     for r in result.rows if r["type"] == "mtc.job.checkpoint_saved.v1"
                     and r["data"]["job_id"] == job.name)
        if pts:
            xs = [(t - t0) / DAY for t, _ in pts]
            ys = [s * job.step_time_s / DAY for _, s in pts]
            ax.step(xs, ys, where="post", label=f"{job.name}: checkpointed progress")
        ax.plot([0, days], [0, days], ls=":", color="grey", lw=1)
        spans = _attempt_spans(result, job.name, t0)
        ax.broken_barh([(a, b - a) for a, b in spans], (-0.06 * days, 0.04 * days),
                       color="tab:green", alpha=0.6)
    ax.set_ylabel("training days kept")
    ax.set_title(f"{result.scenario.name}: progress (green bars: attempts running)")
    ax.legend(loc="upper left", fontsize=8)

    ax = axes[1]
    cats: dict[str, list[float]] = defaultdict(list)
    label = {c.name: c.category for c in result.scenario.failures.causes}
    for t, kind, _, detail in result.timeline:
        if kind == "fault":
            cats[label.get(detail, detail)].append(t / DAY - result.ready_at / DAY)
        elif kind in ("straggler", "planned"):
            cats[kind].append(t / DAY - result.ready_at / DAY)
    names = sorted(cats)
    for i, name in enumerate(names):
        ax.scatter(cats[name], [i] * len(cats[name]), s=10, label=name)
    ax.set_yticks(range(len(names)), names)
    ax.set_title("faults by category (every node, spares included)")

    ax = axes[2]
    times, counts = _out_of_service(result.rows)
    if times:
        ax.step([(t - t0) / DAY for t in times], counts, where="post", color="tab:red")
    ax.set_ylabel("nodes out")
    ax.set_xlabel("days since the cluster was ready")
    ax.set_xlim(0, days)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _attempt_spans(result: RunResult, job: str, t0: float) -> list[tuple[float, float]]:
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for r in result.rows:
        data = r["data"]
        if data.get("job_id") != job:
            continue
        if r["type"] == "mtc.job.started.v1":
            starts[int(data["attempt"])] = float(r["time"])
        elif r["type"] == "mtc.job.workers_exited.v1":
            ends.setdefault(int(data["attempt"]), float(r["time"]))
    end = EPOCH_S + result.horizon
    return [((s - t0) / DAY, (ends.get(a, end) - t0) / DAY) for a, s in sorted(starts.items())]


SWEEP_METRICS = ("goodput", "ettr", "scheduling_goodput", "interruptions", "waiting_h",
                 "cost_per_useful_gpu_h")


def sweep_grid(summary: Sequence[Mapping[str, Any]], keys: Sequence[str], title: str,
               metrics: Sequence[str] = SWEEP_METRICS) -> Grid:
    """A sweep's summary as one table: the varied keys, then each metric's mean and 95% CI,
    clamped to what the metric allows and marked when too few replications make it wide."""
    known = [m for m in metrics if any(row[m] == row[m] for row in summary)]  # NaN: unknown
    grid = Grid(title, (*keys, *known) if keys else ("point", *known),
                left=max(1, len(keys)))
    for row in summary:
        cells = [str(row[k]) for k in keys] or ["all"]
        for metric in known:
            cells.append(interval_text(row[metric], row[f"{metric}_ci"], metric,
                                       int(row.get("n", FEW_REPLICATIONS))))
        grid.add(*cells)
    return grid
