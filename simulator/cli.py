"""``mtc sim run`` and ``mtc sim sweep`` (also ``python -m simulator run|sweep``).

``add_parser(subparsers)`` adds the ``sim`` command to the ``mtc`` CLI; each subcommand sets
``func`` (called with the parsed namespace, returns the exit code).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shared.goodput.totals import ETTR_MEANS
from simulator.overrides import parse_value
from simulator.scenario import DEFAULT_SCENARIO, ScenarioError, load_scenario, packaged


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sim`` (with ``run`` and ``sweep``) to an argparse subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim", help="goodput what-if simulations with the real control plane in the loop",
        description="Simulate a fleet with the real control-plane handlers in the loop.")
    add_commands(parser)
    return parser


def add_replay_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``replay`` (a recorded history through a candidate policy) to the ``mtc`` CLI."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay", help="a recorded event history through a candidate triage table and repair "
                       "configuration: what would have been decided differently",
        description="Replay a recorded event history through a candidate policy.")
    p.add_argument("events", type=Path, help="state dir / mtc.db, Firestore export JSON, or "
                                             "events.jsonl (mtc sim run --events)")
    p.add_argument("--policy", type=Path, required=True, metavar="DIR",
                   help="the candidate: a directory with triage_table*.yaml (and repair.yaml)")
    p.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                   help="the policy to compare with (default: the packaged one)")
    p.add_argument("--twin", action="store_true",
                   help="also run the twin on a scenario fitted to the history under both "
                        "policies and report the goodput difference")
    p.add_argument("--replications", type=int, default=5, help="twin replications (--twin)")
    p.add_argument("--seed", type=int, default=1, help="seed of twin replication 0")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_replay, fn=cmd_replay)
    return p


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console

    from simulator import fit, history, replay

    console = Console(stderr=args.json)
    try:
        rows = history.load_events(args.events)
        candidate = replay.load_policy(args.policy)
        baseline = replay.load_policy(args.baseline, name="baseline")
        if candidate.name == baseline.name:
            candidate = replay.load_policy(args.policy, name=f"{candidate.name}-candidate")
        if args.replications < 2:
            raise replay.PolicyError("--replications must be at least 2 (an interval)")
        durations = {r.action: r.median_s for r in fit.fit(rows).repairs} if rows else {}
        result = replay.replay(rows, candidate, baseline, durations)
        if args.twin:
            with console.status("the twin, under both policies..."):
                result.twin = replay.twin_diff(rows, candidate, baseline,
                                               replications=args.replications, seed=args.seed)
    except ValueError as exc:  # HistoryError, PolicyError, an empty history
        return _refused(console, "replay", exc)
    _emit(console, args.json, result.as_dict(), result.lines())
    return 0


def add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sim_command", required=True,
                                metavar="{run,sweep,fit,plan-spares,advise}")
    ls = sub.add_parser("scenarios", help="the packaged scenarios, runnable by name "
                                          "(mtc sim run llama3)")
    ls.set_defaults(func=cmd_scenarios, fn=cmd_scenarios)

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
                            "spare_layout, nodes_per_rack, bus_latency, or any dotted "
                            "scenario path")
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

    fit = sub.add_parser("fit", help="a scenario estimated from a recorded event history")
    fit.add_argument("events", type=Path, help="a `mtc bench recovery --json` file (its "
                     "recovery costs), or state dir / mtc.db, Firestore export JSON, or "
                     "events.jsonl (mtc sim run --events)")
    fit.add_argument("-o", "--output", type=Path, required=True, help="scenario YAML to write")
    fit.add_argument("--heartbeat-timeout", type=float, default=60.0,
                     help="the control plane's heartbeat timeout, s (detection delays)")
    fit.add_argument("--json", action="store_true", help="print the estimates as JSON")
    fit.set_defaults(func=cmd_fit, fn=cmd_fit)

    plan = sub.add_parser("plan-spares", help="the smallest hot-spare count that meets a "
                                              "target, with a plot of the curve")
    _common(plan)
    plan.add_argument("--spares", default=None, metavar="N1,N2,...",
                      help="spare counts to try (default: a range around the scenario's own "
                           "count, from 0 to twice it; 0,1,2,4,8 when it has 4 or fewer)")
    target = plan.add_mutually_exclusive_group(required=True)
    target.add_argument("--p95-wait", metavar="DURATION",
                        help="target: p95 wait for a spare at most this (10m, 600s)")
    target.add_argument("--goodput-floor", type=float, metavar="G",
                        help="target: mean job goodput at least G (0..1)")
    plan.add_argument("--replications", type=int, default=5)
    plan.add_argument("--seed", type=int, default=1, help="seed of replication 0")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=cmd_plan_spares, fn=cmd_plan_spares)

    adv = sub.add_parser("advise", help="what following checkpoint_resume's checkpoint-interval "
                                        "advice gains (same seeds)")
    _common(adv)
    adv.add_argument("--replications", type=int, default=5)
    adv.add_argument("--seed", type=int, default=1, help="seed of replication 0")
    adv.add_argument("--json", action="store_true", help="print the comparison as JSON")
    adv.set_defaults(func=cmd_advise, fn=cmd_advise)


def cmd_scenarios(args: argparse.Namespace) -> int:
    """Each packaged scenario: its name and the first line of its description."""
    for file in packaged():
        first = next((ln.lstrip("# ").strip() for ln in file.read_text(encoding="utf-8")
                      .splitlines() if ln.startswith("#") and ln.lstrip("# ").strip()), "")
        print(f"{file.stem:<20} {first}")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", default=None,
                   help=f"scenario YAML or a packaged scenario's name (default: "
                   f"{DEFAULT_SCENARIO.stem}, Llama 3 405B; `mtc sim scenarios` lists them)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one scenario value (same keys as --vary)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: sim-out/<scenario name>)")
    p.add_argument("--uncertainty", type=int, nargs="?", const=10, default=None, metavar="N",
                   help="draw the uncertain recovery inputs N times (default 10) from their "
                        "ranges and report ETTR and goodput as a band, with the best case "
                        "and durable-only on the same draws")
    p.add_argument("--sampling", choices=("lhs", "equal"), default="lhs",
                   help="--uncertainty draws: Latin hypercube or equal-spaced (seeded)")


def _overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ScenarioError(f"--set {item}", "must look like key=value")
        out[key.strip()] = parse_value(value.strip())
    return out


def _refused(console: Any, what: str, exc: Exception) -> int:
    """A bad scenario or input: said plainly, exit code 2."""
    label = "scenario error" if isinstance(exc, ScenarioError) else f"cannot {what}"
    console.print(f"[red]{label}[/red] {exc}")
    return 2


def _emit(console: Any, as_json: bool, data: Any, lines: list[str]) -> None:
    """``--json``: the machine form on stdout; else plain lines (nothing cut when narrow)."""
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        for line in lines:
            console.print(line, highlight=False, markup=False)


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from simulator import report, twin

    console = Console(stderr=args.json)
    try:
        scenario = load_scenario(args.scenario, _overrides(args.set))
    except ScenarioError as exc:
        console.print(f"[red]scenario error[/red] {exc}")
        return 2
    if args.uncertainty is not None:
        seed = scenario.seed if args.seed is None else args.seed
        return _uncertainty(args, console, scenario.name, (), 1, seed)
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
    if args.uncertainty is not None:
        code = 0
        for point in sweep.grid(vary):
            code = max(code, _uncertainty(args, console, scenario.name, point,
                                          args.replications, args.seed))
        return code
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


def _uncertainty(args: argparse.Namespace, console: Any, name: str,
                 point: tuple[tuple[str, str], ...], replications: int, seed: int) -> int:
    """``--uncertainty``: the scenario (at one grid point) at every draw, durable-only on the
    same draws, and the best case; the band printed and written to ``uncertainty.json``."""
    from simulator import sweep, uncertainty

    try:
        if load_scenario(args.scenario, _overrides(args.set)).recovery is None:
            raise ScenarioError("recovery", "--uncertainty draws the recovery block's costs: "
                                            "the scenario has none")
        points = uncertainty.draws(args.uncertainty, args.sampling, seed)
        all_tasks = uncertainty.tasks(args.scenario, _overrides(args.set), point, points,
                                      replications, seed)
        for task in all_tasks[:2]:
            sweep.validate(task)
    except (ScenarioError, ValueError) as exc:
        return _refused(console, "draw", exc)
    label = ", ".join(f"{k}={v}" for k, v in point)
    with console.status(f"{name}{' ' + label if label else ''}: {len(all_tasks)} runs "
                        f"({args.uncertainty} {args.sampling} draws)..."):
        rows = sweep.run_sweep(all_tasks, processes=getattr(args, "processes", None))
    summary = uncertainty.summarise(rows)
    out = args.out or Path("sim-out") / f"{name}-uncertainty"
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"uncertainty{'-' + '-'.join(v for _, v in point) if point else ''}.json")
    path.write_text(json.dumps({"point": dict(point), "sampling": args.sampling,
                                "seed": seed, "draws": points, "summary": summary,
                                "ranges": [vars(r) for r in uncertainty.RANGES]},
                               indent=1, default=str))
    title = f"{name}{' (' + label + ')' if label else ''}: ETTR and goodput, central value " \
            f"[lowest, highest draw]"
    _emit(console, getattr(args, "json", False), summary,
          [*uncertainty.lines(summary, title), ETTR_MEANS, f"wrote {path}"])
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    import yaml
    from rich.console import Console

    from simulator import bench_costs, fit, fitted, history

    console = Console(stderr=args.json)
    bench = bench_costs.is_bench_document(str(args.events))
    if bench is not None:  # a `mtc bench recovery --json` file: the recovery costs
        try:
            raw, costs = bench_costs.fitted_scenario(bench, name=args.output.stem)
        except (ValueError, KeyError, TypeError) as exc:  # ValidationError too
            return _refused(console, "fit", exc)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(yaml.safe_dump(raw, sort_keys=False))
        _emit(console, args.json, costs.as_dict(), [
            f"recovery costs fitted from {args.events}:",
            *(f"  {k}: {v}" for k, v in costs.as_dict().items())])
        console.print(f"wrote {args.output} (mtc sim run {args.output})")
        return 0
    try:
        result = fit.fit(history.load_events(args.events),
                         heartbeat_timeout_s=args.heartbeat_timeout)
    except ValueError as exc:  # HistoryError too
        return _refused(console, "fit", exc)
    raw = fitted.to_scenario(result, name=args.output.stem, source=str(args.events))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(yaml.safe_dump(raw, sort_keys=False))
    _emit(console, args.json, result.as_dict(), fitted.summary_lines(result))
    console.print(f"wrote {args.output} (mtc sim run {args.output})")
    return 0


def cmd_plan_spares(args: argparse.Namespace) -> int:
    from rich.console import Console

    from simulator import spares
    from simulator.scenario import duration

    console = Console(stderr=args.json)
    try:
        wait = duration(args.p95_wait, "--p95-wait") if args.p95_wait is not None else None
        fixed = _overrides(args.set)
        scenario = load_scenario(args.scenario, fixed)
        own = sum(p.spares for p in scenario.cluster.partitions)
        counts = ([int(x) for x in args.spares.split(",") if x.strip()]
                  if args.spares is not None else spares.default_counts(own))
        console.print(f"{scenario.name}: spare counts {counts} (the scenario has {own}) x "
                      f"{args.replications} replications", soft_wrap=True, highlight=False)
        with _progress(console, f"{scenario.name}: plan-spares") as tick:
            plan = spares.plan_spares(args.scenario, counts, replications=args.replications,
                                      seed=args.seed, max_p95_wait_s=wait,
                                      min_goodput=args.goodput_floor, overrides=fixed,
                                      progress=tick)
    except ValueError as exc:  # ScenarioError too
        return _refused(console, "plan", exc)
    out = args.out or Path("sim-out") / f"{scenario.name}-spares"
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan-spares.json").write_text(json.dumps(plan.as_dict(), indent=1))
    png = spares.plot(plan, out / "plan-spares.png", max_p95_wait_s=wait,
                      min_goodput=args.goodput_floor)
    _emit(console, args.json, plan.as_dict(), plan.lines())
    console.print(f"wrote {png} and {out / 'plan-spares.json'}")
    return 0 if plan.best is not None else 1


@contextlib.contextmanager
def _progress(console: Any, what: str) -> Iterator[Callable[[int, int, int], None]]:
    """A spinner in a terminal; piped, one line per spare count done on stderr (a spinner
    draws nothing off a terminal, and a long plan looked hung)."""
    if console.is_terminal:
        with console.status(f"{what}...") as status:
            yield lambda done, total, k: status.update(
                f"{what}: {done}/{total} runs (spares {k})")
        return

    def line(done: int, total: int, k: int) -> None:
        print(f"{what}: {done}/{total} runs (spares {k})", file=sys.stderr, flush=True)

    yield line


def cmd_advise(args: argparse.Namespace) -> int:
    from rich.console import Console

    from simulator import advice

    console = Console(stderr=args.json)
    try:
        fixed = _overrides(args.set)
        scenario = load_scenario(args.scenario, fixed)
        with console.status(f"{scenario.name}: as written, then following the advice..."):
            out = advice.follow_advice(args.scenario, replications=args.replications,
                                       seed=args.seed, overrides=fixed)
    except ValueError as exc:  # ScenarioError too
        return _refused(console, "compare", exc)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "advice.json").write_text(json.dumps(out, indent=1))
    _emit(console, args.json, out, advice.lines(out))
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
