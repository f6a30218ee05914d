"""Regenerate the figures and tables of docs/validation.md.

    .venv/bin/python bench/sim_validation.py analytic            # ~2 min on one core
    .venv/bin/python bench/sim_validation.py llama3 --replications 4
    .venv/bin/python bench/sim_validation.py scale                # ~20 s

``scale``: the twin's ETTR against the ETTR-versus-job-size model of Meta's reliability study
(arXiv:2410.21680) at 128 to 16,384 GPUs, a markdown table for docs/validation.md.

``analytic``: the twin's ETTR against Meta's model and 1 - first-order waste over a grid of
job sizes, job MTBFs and checkpoint intervals, with Young's and Daly's intervals marked
(docs/img/validation_ettr.png, docs/img/validation_analytic.json).

``llama3``: the default scenario, several seeds on every core: interruptions by cause against
the published table, effective training time (docs/img/llama3_causes.png,
docs/img/llama3_timeline.png, docs/img/llama3.json).
"""

from __future__ import annotations

import sys
from pathlib import Path as _Path

sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(_Path(__file__).resolve().parent))

import argparse
import json
import multiprocessing
from collections import defaultdict
from pathlib import Path
from typing import Any

IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
HOUR = 3600.0


def analytic(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from shared.policies.checkpointing import first_order_waste, meta_ettr

    sizes = (16, 128)
    mtbfs = (1.0, 3.1, 8.0)
    intervals = (5, 10, 20, 30, 60, 120)
    points = []
    with multiprocessing.get_context("fork").Pool(args.processes) as pool:
        jobs = [(n, m, i) for n in sizes for m in mtbfs for i in intervals]
        for p in pool.starmap(_point, jobs):
            points.append(p)
            print(json.dumps(p), flush=True)
    fig, axes = plt.subplots(len(sizes), len(mtbfs), figsize=(14, 7.5), squeeze=False)
    for r, n in enumerate(sizes):
        for c, m in enumerate(mtbfs):
            ax = axes[r][c]
            pts = [p for p in points if p["nodes"] == n and p["job_mtbf_s"] == m * HOUR]
            xs = [p["interval_s"] / 60 for p in pts]
            restart = float(np.mean([p["restart_s"] for p in pts]))
            grid = np.linspace(2, 130, 200)
            rate = 1.0 / (m * HOUR * n)
            ax.plot(grid, [meta_ettr(n, rate, restart, g * 60, 30.0) for g in grid],
                    label="Meta ETTR model", color="tab:blue")
            ax.plot(grid, [1 - first_order_waste(g * 60, 30.0, restart, m * HOUR)
                           for g in grid], ls="--", label="1 - first-order waste",
                    color="tab:orange")
            ax.plot(xs, [p["sim_ettr"] for p in pts], "ko", label="twin (real handlers)")
            ax.axvline(pts[0]["young_s"] / 60, color="grey", ls=":", label="Young")
            ax.axvline(pts[0]["daly_s"] / 60, color="tab:green", ls=":", label="Daly")
            ax.set_ylim(max(0.0, min(p["sim_ettr"] for p in pts) - 0.1), 1.0)
            ax.set_title(f"{n} nodes, job MTBF {m:g} h, restart {restart:.0f} s", fontsize=9)
            ax.set_xlabel("checkpoint interval (min)")
            ax.set_ylabel("ETTR")
            ax.grid(alpha=0.3)
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    fig.suptitle("Simulated ETTR vs the analytic models (checkpoint save 30 s, ~300 failures "
                 "per point)")
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG / "validation_ettr.png", dpi=100)
    (IMG / "validation_analytic.json").write_text(json.dumps(points, indent=1))


def _point(nodes: int, mtbf_h: float, interval_min: int) -> dict[str, float]:
    from simulator.validation import run_point

    return run_point(nodes=nodes, job_mtbf_s=mtbf_h * HOUR, interval_s=interval_min * 60.0,
                     failures=300).as_dict()


def _llama_run(seed: int) -> dict[str, Any]:
    from simulator import twin
    from simulator.goodput import Badput
    from simulator.scenario import load_scenario

    result = twin.run(load_scenario(), seed=seed)
    jg = result.job()
    if seed == 1:
        from simulator import report

        report.plot_timeline(result, IMG / "llama3_timeline.png")
    return {
        "seed": seed, "interruptions": result.interruptions,
        "unexpected": sum(v for k, v in result.interruptions.items()
                          if k != "planned_maintenance"),
        "planned": result.interruptions.get("planned_maintenance", 0),
        "restarts": sum(result.restarts.values()), "ettr": jg.ettr, "goodput": jg.goodput,
        "scheduling": jg.scheduling_goodput, "runtime": jg.runtime_goodput,
        "program": jg.program_goodput,
        "badput_h": {k: v / HOUR for k, v in jg.by_category().items() if v},
        "waiting_h": jg.lost(Badput.WAITING_FOR_CAPACITY) / HOUR,
        "replacements": result.repairs.get("replace", 0), "repairs": result.repairs,
        "wall_s": result.timings.wall_s, "events": result.events,
    }


def llama3(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from simulator.failures import LLAMA3_UNEXPECTED

    seeds = list(range(1, args.replications + 1))
    with multiprocessing.get_context("fork").Pool(args.processes) as pool:
        runs = pool.map(_llama_run, seeds)
    mean: dict[str, float] = defaultdict(float)
    for run in runs:
        for cause, n in run["interruptions"].items():
            mean[cause] += n / len(runs)
    causes = list(LLAMA3_UNEXPECTED)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    xs = range(len(causes))
    ax.bar([x - 0.2 for x in xs], [LLAMA3_UNEXPECTED[c][2] for c in causes], width=0.4,
           label="Llama 3 (published)")
    ax.bar([x + 0.2 for x in xs], [mean.get(c, 0.0) for c in causes], width=0.4,
           label=f"twin (mean of {len(runs)} seeds)")
    ax.set_xticks(list(xs), [LLAMA3_UNEXPECTED[c][0] for c in causes], rotation=60,
                  ha="right", fontsize=8)
    ax.set_ylabel("unexpected interruptions in 54 days")
    ax.legend()
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG / "llama3_causes.png", dpi=100)
    (IMG / "llama3.json").write_text(json.dumps({"runs": runs, "mean": mean}, indent=1))
    print(json.dumps({"mean": mean, "runs": runs}, indent=1))


def scale(args: argparse.Namespace) -> None:
    """The twin's ETTR against the Meta study's model at growing job sizes (one table row each)."""
    from shared.policies.checkpointing import meta_job_mttf_s
    from simulator.validation import RSC1_FAILURES_PER_1000_NODE_DAYS, scale_points

    gpus = (128, 1024, 8192, 16384)
    print("| GPUs | job MTTF | seed | failures | restart (measured) | twin ETTR | Meta model "
          "| twin - Meta |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for seed in range(1, args.seeds + 1):
        for g, p in zip(gpus, scale_points(gpus, seed=seed), strict=True):
            mttf_h = meta_job_mttf_s(g, RSC1_FAILURES_PER_1000_NODE_DAYS) / HOUR
            print(f"| {g:,} | {mttf_h:.1f} h | {seed} | {p.interruptions} | {p.restart_s:.0f} s "
                  f"| {p.sim_ettr:.3f} | {p.meta_ettr:.3f} | {p.sim_ettr - p.meta_ettr:+.3f} |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("analytic")
    p.add_argument("--processes", type=int, default=None)
    p = sub.add_parser("llama3")
    p.add_argument("--replications", type=int, default=4)
    p.add_argument("--processes", type=int, default=None)
    p = sub.add_parser("scale")
    p.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    {"analytic": analytic, "llama3": llama3, "scale": scale}[args.cmd](args)


if __name__ == "__main__":
    main()
