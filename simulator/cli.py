"""``mtc sim run`` and ``mtc sim sweep`` (also ``python -m simulator run|sweep``).

``add_parser(subparsers)`` adds the ``sim`` command to the ``mtc`` CLI; each subcommand sets
``func`` (called with the parsed namespace, returns the exit code).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from simulator.scenario import DEFAULT_SCENARIO, ScenarioError, load_scenario, parse_value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sim`` (with ``run`` and ``sweep``) to an argparse subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim", help="goodput what-if simulations with the real control plane in the loop",
        description="Simulate a fleet with the real control-plane handlers in the loop.")
    add_commands(parser)
    return parser


def add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_command", required=True, metavar="{run,sweep}")
    run = sub.add_parser("run", help="one seeded run: goodput table and a timeline plot")
    _common(run)
    run.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    run.add_argument("--json", action="store_true", help="print the summary as JSON only")
    run.add_argument("--no-plot", action="store_true", help="do not write the timeline PNG")
    run.add_argument("--events", action="store_true",
                     help="also write the event log (events.jsonl)")
    run.set_defaults(func=cmd_run, fn=cmd_run)

    sweep = sub.add_parser("sweep", help="a grid of what-ifs x replications, on every core")
    _common(sweep)
    sweep.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a parameter and its values (repeat for a grid); keys: "
                            "checkpoint_interval, checkpoint_save, spares, nodes, "
                            "failure_scale, lemon_fraction, ladder (a+b+c), duration, "
                            "bus_latency, or any dotted scenario path")
    sweep.add_argument("--replications", type=int, default=10)
    sweep.add_argument("--seed", type=int, default=1, help="seed of replication 0")
    sweep.add_argument("--processes", type=int, default=None,
                       help="worker processes (default: every core; local runs only)")
    slurm = sweep.add_argument_group(
        "on a Slurm cluster (--on slurm)",
        "one job array, a task per (configuration, replication); sbatch and squeue use the "
        "environment's SLURM_CONF; the work folder must be on storage the nodes share")
    sweep.add_argument("--on", choices=("local", "slurm"), default="local",
                       help="where the replications run (default: local processes)")
    slurm.add_argument("--slurm-dir", type=Path, default=None,
                       help="shared work folder for tasks, results and logs (default: "
                            "OUT/slurm)")
    slurm.add_argument("--slurm-partition", default=None, help="partition to submit to")
    slurm.add_argument("--slurm-max-parallel", type=int, default=None,
                       help="at most this many array tasks at once (the %%N throttle)")
    slurm.add_argument("--slurm-python", default=sys.executable,
                       help="the Python on the nodes (default: this one)")
    slurm.add_argument("--slurm-workdir", type=Path, default=None,
                       help="the mtc checkout on the nodes (default: this one)")
    slurm.add_argument("--slurm-timeout", type=float, default=3600.0,
                       help="seconds to wait for the array before cancelling it")
    slurm.add_argument("--slurm-retries", type=int, default=1,
                       help="resubmit tasks that left no result this many times")
    sweep.set_defaults(func=cmd_sweep, fn=cmd_sweep)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", default=None,
                   help=f"scenario YAML (default: {DEFAULT_SCENARIO.name}, Llama 3 405B)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one scenario value (same keys as --vary)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: sim-out/<scenario name>)")


def _overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ScenarioError(f"--set {item}", "must look like key=value")
        out[key.strip()] = parse_value(value.strip())
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from simulator import report, twin

    console = Console(stderr=args.json)
    try:
        scenario = load_scenario(args.scenario, _overrides(args.set))
    except ScenarioError as exc:
        console.print(f"[red]scenario error[/red] {exc}")
        return 2
    with console.status(f"simulating {scenario.name} ({scenario.cluster.gpus} GPUs, "
                        f"{scenario.duration_s / 86400:g} days)..."):
        result = twin.run(scenario, seed=args.seed)
    out = args.out or Path("sim-out") / scenario.name
    out.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    summary["timings"] = {"wall_s": result.timings.wall_s,
                          "handlers_s": result.timings.handlers_s,
                          "accounting_s": result.timings.accounting_s,
                          "by_service_s": result.timings.by_service}
    summary["truth"] = result.truth
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if args.events:
        with (out / "events.jsonl").open("w") as fh:
            for row in result.rows:
                fh.write(json.dumps(row, default=str) + "\n")
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    else:
        report.print_run(result, console)
    if not args.no_plot:
        path = report.plot_timeline(result, out / "timeline.png")
        console.print(f"wrote {path} and {out / 'summary.json'}", soft_wrap=True)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from simulator import layout, report, sweep

    console = Console()
    try:
        vary = sweep.parse_vary(args.vary)
        fixed = _overrides(args.set)
        scenario = load_scenario(args.scenario, fixed)
        all_tasks = sweep.tasks(args.scenario, vary, args.replications, args.seed, fixed)
        for task in {t.point: t for t in all_tasks}.values():
            sweep.validate(task)
    except ScenarioError as exc:
        console.print(f"[red]scenario error[/red] {exc}")
        return 2
    if args.replications < 1:
        console.print("[red]--replications must be at least 1[/red]")
        return 2
    out = args.out or Path("sim-out") / f"{scenario.name}-sweep"
    started = time.perf_counter()
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task(f"{scenario.name}: {len(all_tasks)} runs", total=len(all_tasks))
        def tick(done: int, _total: int) -> None:
            progress.update(bar, completed=done)

        try:
            rows = _run_rows(args, all_tasks, out, tick)
        except RuntimeError as exc:  # SlurmSweepError: submit, timeout, tasks left undone
            console.print(f"[red]sweep failed[/red] {exc}")
            return 1
    keys = [k for k, _ in vary]
    summary = sweep.aggregate(rows, keys)
    meta = {"scenario": str(args.scenario or DEFAULT_SCENARIO), "vary": vary,
            "set": args.set, "replications": args.replications, "seed": args.seed,
            "on": args.on, "wall_s": time.perf_counter() - started}
    paths = sweep.write_results(out, rows, summary, meta)
    if vary:
        paths += sweep.plot_sweep(out, summary, vary)
    layout.render(console, report.sweep_grid(summary, keys, f"{scenario.name}: mean over "
                                         f"{args.replications} replications (95% CI)"))
    for path in paths:
        console.print(f"wrote {path}", soft_wrap=True)
    return 0


def _run_rows(args: argparse.Namespace, all_tasks: list[Any], out: Path,
              tick: Any) -> list[dict[str, Any]]:
    from simulator import sweep

    if args.on == "local":
        return sweep.run_sweep(all_tasks, processes=args.processes, progress=tick)
    from simulator import sweep_slurm

    options = sweep_slurm.SlurmOptions(
        partition=args.slurm_partition, max_parallel=args.slurm_max_parallel,
        python=args.slurm_python, workdir=(args.slurm_workdir or sweep_slurm.REPO).resolve(),
        timeout_s=args.slurm_timeout, retries=max(0, args.slurm_retries))
    return sweep_slurm.run_on_slurm(all_tasks, args.slurm_dir or out / "slurm", options, tick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator",
                                     description="mtc goodput what-if simulator")
    add_commands(parser)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
