"""What `mtc bench recovery` prints and draws: a rich table, the JSON document, a PNG."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shared.goodput.totals import ETTR_MEANS
from shared.resilience.score import IncidentScore, RunScore, recover_ratio
from shared.resilience.trace import Trace


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _steps(i: IncidentScore) -> str:
    if i.steps_lost is None:
        return "-"
    return f"{i.steps_lost}{'~' if i.step_estimated else ''}"


def ratios(runs: Sequence[RunScore]) -> dict[str, list[dict[str, Any]]]:
    """Per target, each fault's requeue time to recover over the chosen mode's."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.label != "chosen":
            continue
        pinned = next((r for r in runs if r.target == run.target and r.label != "chosen"), None)
        if pinned is not None:
            out[run.target] = recover_ratio(run, pinned)
    return out


def twin_vs_live(runs: Sequence[RunScore]) -> list[dict[str, Any]]:
    """Per incident (matched by index): the live and the twin's mode and fault-to-resumed,
    and the twin's over the live one; empty unless both chose their modes in this run."""
    live = next((r for r in runs if r.target != "twin" and r.label == "chosen"), None)
    twin = next((r for r in runs if r.target == "twin" and r.label == "chosen"), None)
    if live is None or twin is None:
        return []
    theirs = {i.index: i for i in twin.incidents}
    out = []
    for mine in live.incidents:
        o = theirs.get(mine.index)
        ratio = None
        if o is not None and mine.recovered_s and o.recovered_s is not None:
            ratio = round(o.recovered_s / mine.recovered_s, 3)
        out.append({"index": mine.index, "kind": mine.kind, "live_mode": mine.mode,
                    "twin_mode": o.mode if o is not None else None,
                    "same_mode": o is not None and o.mode == mine.mode,
                    "live_s": mine.recovered_s, "twin_s": o.recovered_s if o else None,
                    "twin_over_live": ratio})
    return out


def document(trace: Trace, runs: Sequence[RunScore], command: str) -> dict[str, Any]:
    return {"command": command, "trace": trace.as_dict(),
            "runs": [r.as_dict() for r in runs], "requeue_over_chosen": ratios(runs),
            "twin_vs_live": twin_vs_live(runs)}


def print_twin_vs_live(console: Console, runs: Sequence[RunScore]) -> None:
    rows = twin_vs_live(runs)
    if not rows:
        return
    table = Table("#", "FAULT", "LIVE MODE", "TWIN MODE", "LIVE s", "TWIN s", "TWIN/LIVE",
                  title="fault to resumed: the twin (the live run's fitted costs) beside the "
                  "live run")
    for x in rows:
        table.add_row(str(x["index"]), x["kind"], x["live_mode"], str(x["twin_mode"]),
                      _secs(x["live_s"]), _secs(x["twin_s"]),
                      "-" if x["twin_over_live"] is None else f"{x['twin_over_live']:.2f}")
    console.print(table)


def print_table(console: Console, trace: Trace, runs: Sequence[RunScore]) -> None:
    by_ratio = {(t, x["index"]): x["ratio"] for t, xs in ratios(runs).items() for x in xs}
    table = Table("TARGET", "RUN", "#", "FAULT", "NODE", "MODE", "DETECT s", "RECOVER s",
                  "STEPS LOST", "REQUEUE/CHOSEN",
                  title=f"mtc bench recovery: trace {trace.name} v{trace.version} "
                  f"({trace.job.replicas} ranks, step {trace.job.step_time_s:g} s, durable "
                  f"every {trace.job.checkpoint_every} steps)")
    for run in runs:
        for i in run.incidents:
            ratio = by_ratio.get((run.target, i.index)) if run.label == "chosen" else None
            table.add_row(run.target, run.label, str(i.index), i.kind, i.node_id, i.mode,
                          _secs(i.detected_s), _secs(i.recovered_s), _steps(i),
                          "-" if ratio is None else f"{ratio:.1f}x")
    console.print(table)
    for run in runs:
        for skip in run.skipped:
            console.print(f"{run.target}/{run.label}: fault {skip['index']} ({skip['kind']}) "
                          f"skipped: {skip['reason']}")
    for run in runs:
        g = run.goodput
        console.print(f"{run.target}/{run.label}: runtime goodput {g.get('runtime_goodput', 0):.1%}"
                      f", ETTR {g.get('ettr', 0):.1%}, wall {g.get('wall_s', 0):.1f} s, "
                      f"restarts {g.get('restarts', 0)}, recovery {g.get('recovery_s', 0):.1f} s")
    console.print(f"[dim]{ETTR_MEANS}[/dim]")
    print_twin_vs_live(console, runs)
    console.print("[dim]~: steps lost from an estimated step at the fault (the newest "
                  "checkpoint and the measured pace; no progress heartbeat)[/dim]")


def write_outputs(out: Path, doc: dict[str, Any], runs: Sequence[RunScore]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recovery-bench.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return [path, plot(runs, out / "recovery-bench.png")]


def plot(runs: Sequence[RunScore], path: Path) -> Path:
    """Time to recover and steps lost per fault, one bar per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [f"{i.index}: {i.kind}" for i in runs[0].incidents] if runs else []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(runs))
    for n, run in enumerate(runs):
        xs = [k + n * width for k in range(len(run.incidents))]
        label = f"{run.target}/{run.label}"
        axes[0].bar(xs, [i.recovered_s or 0.0 for i in run.incidents], width, label=label)
        axes[1].bar(xs, [i.steps_lost or 0 for i in run.incidents], width, label=label)
    for ax, title in zip(axes, ("fault to resumed (s)", "steps lost"), strict=True):
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(kinds))], kinds, rotation=20,
                      fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
