"""`mtc bench recovery`: play a scripted fault trace live and in the twin, score each incident.

The trace (``--trace``: a packaged name or a YAML file; default: one fault of each kind) is
played against the embedded default (a fresh state directory: ``var/bench``, or ``mtc-bench``
inside ``--state-dir``) and then against the twin with the live run's costs and policy
inputs, fitted (``simulator.bench_costs``); each incident's twin fault-to-resumed is printed
beside the live one with their ratio;
``--target slurm`` plays it live on a private Slurm cluster instead (``bench_slurm``).
``--compare requeue`` plays it live a second time with the job pinned to the plain requeue
(label ``mtc-recovery-mode: requeue``) and prints the ratio of the times to recover.
Output: a table, ``--json`` (the document), ``--out DIR`` (the JSON and a PNG).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.domain.errors import ValidationError
from shared.resilience.trace import Trace, load_trace, packaged_traces

if TYPE_CHECKING:
    from shared.resilience.score import RunScore
    from simulator.bench_costs import RecoveryCosts

DEFAULT_STATE_DIR = Path("var/bench")
STATE_SUBDIR = "mtc-bench"
TARGETS = ("embedded", "twin", "both", "slurm")
MODES = ("requeue", "in_place", "hot_swap", "scale_down")


def add_parser(sub: Any, common: list[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("bench", help="benchmarks of a live deployment and the twin")
    bsub = b.add_subparsers(dest="action", required=True)
    r = bsub.add_parser("recovery", parents=common, help="play a scripted fault trace and "
                        "score each incident (detect, recover, steps lost, mode, goodput)",
                        description=__doc__.splitlines()[0])
    r.add_argument("--trace", default=None, metavar="NAME|FILE",
                   help=f"a trace file or a packaged trace ({', '.join(packaged_traces())}; "
                   "default: default)")
    r.add_argument("--target", choices=TARGETS, default="both",
                   help="embedded (live, in process), twin, both (default), or slurm (live "
                   "on a private Slurm cluster this command starts and stops; root only)")
    r.add_argument("--compare", choices=MODES, default=None, metavar="MODE",
                   help="also play the trace with the job pinned to MODE (requeue: today's "
                   "path) and print the ratio of the times to recover")
    r.add_argument("--live", choices=("embedded", "slurm"), default="embedded",
                   help="with --target both: the live run the twin is set against and fitted "
                   "to (slurm: a private Slurm cluster, root only; default embedded)")
    r.add_argument("--program", choices=("train", "torch"), default="train",
                   help="the job's program on the live targets: examples/train.py (numpy, "
                   "default) or examples/torch_inprocess.py (torch DDP, gloo on CPU)")
    r.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="write recovery-bench.json and recovery-bench.png there")
    r.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="the longest wait for one step of the run (default 120 s)")
    r.set_defaults(fn=cmd_bench_recovery)


def bench_state_dir(named: str | None) -> Path:
    return Path(named) / STATE_SUBDIR if named else DEFAULT_STATE_DIR


def cmd_bench_recovery(args: argparse.Namespace, named: str | None) -> int:
    if getattr(args, "api", None):
        raise ValidationError("--api", "`mtc bench recovery` plays faults through the local "
                              "fault injection and reads the event log: run it on the "
                              "embedded default (drop --api)")
    # imported here: every `mtc` command builds this module's parser, only `mtc bench`
    # runs it
    from rich.console import Console

    from services.cli.bench_report import document, print_table, write_outputs

    trace = load_trace(args.trace)
    quiet = bool(args.json)
    console = Console(highlight=False, stderr=quiet)
    console.width = max(console.width, 132)  # the table's ten columns, unclipped

    def say(msg: str) -> None:
        console.print(f"[dim]{msg}[/dim]")

    runs = play(trace, target=args.target, compare=args.compare,
                state_root=bench_state_dir(named), timeout_s=args.timeout, say=say,
                program=args.program, live=args.live)
    command = "mtc " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "mtc bench recovery"
    doc = document(trace, runs, command)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print_table(console, trace, runs)
    if args.out is not None:
        for path in write_outputs(args.out, doc, runs):
            console.print(f"wrote {path}")
    return 0


def play(trace: Trace, *, target: str, compare: str | None, state_root: Path,
         timeout_s: float, say: Any, program: str = "train", live: str = "embedded"
         ) -> list[RunScore]:
    """Every run the options ask for, live first (the twin takes the costs it measured;
    ``live``: which live run ``both`` plays, embedded or slurm)."""
    from services.cli.demo import fresh_state

    runs: list[RunScore] = []
    costs: RecoveryCosts | None = None
    if target == "slurm" or (target == "both" and live == "slurm"):
        from services.cli.bench_slurm import require_root, run_slurm

        require_root()  # before anything is started or wiped
        for pin in (None, compare) if compare else (None,):
            label = pin or "chosen"
            say(f"slurm/{label}: trace {trace.name}, {len(trace.faults)} faults")
            state = fresh_state(state_root / f"slurm-{label}")
            runs.append(run_slurm(trace, state, pin=pin, timeout_s=timeout_s, say=say,
                                  program=program))
        if target == "slurm":
            return runs
        costs = measured_costs(runs[0])
    elif target in ("embedded", "both"):
        from services.cli.bench_live import run_embedded

        for pin in (None, compare) if compare else (None,):
            label = pin or "chosen"
            say(f"embedded/{label}: trace {trace.name}, {len(trace.faults)} faults")
            state = fresh_state(state_root / f"run-{label}")
            runs.append(run_embedded(trace, state, pin=pin, timeout_s=timeout_s, say=say,
                                     program=program))
        costs = measured_costs(runs[0])
    if target in ("twin", "both"):
        from services.cli.bench_twin import run as run_twin

        say("twin: the same faults at the same times"
            + (f" with the live run's fitted costs (cold startup {costs.startup_s:.2f} s, "
               f"save on SIGTERM to {costs.sigterm_save})" if costs else ""))
        if costs is not None:
            from services.cli.bench_twin import calibrate

            costs = calibrate(trace, costs, runs[0])
        runs.append(replace(run_twin(trace, costs=costs),
                            costs=costs.as_dict() if costs is not None else {}))
    return runs


def measured_costs(run: RunScore) -> RecoveryCosts:
    """The live run's recovery costs and policy inputs, fitted (``simulator.bench_costs``):
    startup per mode, restore per tier, detection per signal, where the save on SIGTERM goes
    and how often tier entries are heard of."""
    from simulator.bench_costs import fit_run

    return fit_run(run.as_dict())
