"""A sweep as a Slurm job array: ``mtc sim sweep --on slurm``.

The parent writes every task (scenario, overrides, replication, seed) to ``tasks.json`` in a
work folder that the cluster's nodes share, submits one array (``sbatch --array=0-N``) whose
task ``i`` runs ``python -m simulator.sweep_slurm task tasks.json results/ i``, waits for the
array to leave the queue (``squeue``, no accounting needed) and merges ``results/*.json`` in
task order. A task's row is what :func:`simulator.sweep.run_task` returns locally, so the merged
tables equal a local sweep's with the same seeds (wall-clock timings aside). Tasks whose result
is missing (a node died, the task failed) are resubmitted as a smaller array up to ``retries``
times; after that the sweep fails naming them and their log files. Every path and value in the
generated script is ``shlex``-quoted and sbatch gets an argv list: nothing reaches a shell
unquoted.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simulator.sweep import Task, run_task

REPO = Path(__file__).resolve().parents[1]
TASKS_FILE = "tasks.json"
RESULTS = "results"
LOGS = "logs"


class SlurmSweepError(RuntimeError):
    """The array could not be submitted, did not finish in time, or left tasks without a
    result after its retries."""


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    max_parallel: int | None = None  # the array's %N throttle
    python: str = sys.executable  # the interpreter on the nodes (a shared venv)
    workdir: Path = REPO  # the checkout on the nodes
    timeout_s: float = 3600.0
    poll_s: float = 1.0
    retries: int = 1
    job_name: str = "mtc-sim-sweep"
    max_array: int = 1000  # array indices stay below this (Slurm's MaxArraySize: 1001)
    env: Mapping[str, str] | None = None  # for sbatch/squeue (SLURM_CONF); default os.environ


def result_path(work: Path, index: int) -> Path:
    return work / RESULTS / f"result-{index:06d}.json"


def write_tasks(work: Path, all_tasks: Sequence[Task]) -> Path:
    """The tasks, with scenario paths made absolute (the nodes run in their own folder);
    results of an earlier sweep in the same folder are removed so none is merged by mistake."""
    (work / RESULTS).mkdir(parents=True, exist_ok=True)
    (work / LOGS).mkdir(parents=True, exist_ok=True)
    for old in (work / RESULTS).glob("result-*.json"):
        old.unlink()
    data = [{**asdict(t), "scenario": None if t.scenario is None
             else str(Path(t.scenario).resolve())} for t in all_tasks]
    path = work / TASKS_FILE
    path.write_text(json.dumps(data, indent=1))
    return path


def load_task(data: Mapping[str, Any]) -> Task:
    return Task(scenario=data["scenario"],
                overrides=tuple((k, v) for k, v in data["overrides"]),
                point=tuple((k, v) for k, v in data["point"]),
                replication=int(data["replication"]), seed=int(data["seed"]))


def array_script(work: Path, options: SlurmOptions) -> str:
    """The batch script every array task runs: task ``$1 + SLURM_ARRAY_TASK_ID`` of
    ``tasks.json`` (the offset keeps array indices under the cluster's MaxArraySize)."""
    q = shlex.quote
    return "\n".join([
        "#!/bin/bash",
        "set -euo pipefail",
        f"cd {q(str(options.workdir))}",
        f"export PYTHONPATH={q(str(options.workdir))}",
        f"exec {q(options.python)} -m simulator.sweep_slurm task "
        f"{q(str(work / TASKS_FILE))} {q(str(work / RESULTS))} "
        "\"$(( ${1:-0} + SLURM_ARRAY_TASK_ID ))\"",
        "",
    ])


def chunks(indices: Sequence[int], max_array: int) -> list[tuple[int, list[int]]]:
    """(offset, array indices) groups whose indices stay below ``max_array``."""
    out: list[tuple[int, list[int]]] = []
    for i in sorted(indices):
        if out and i - out[-1][0] < max_array:
            out[-1][1].append(i - out[-1][0])
        else:
            out.append((i, [0]))
    return out


def sbatch_argv(work: Path, offset: int, indices: Sequence[int],
                options: SlurmOptions) -> list[str]:
    spec = ",".join(str(i) for i in indices) if len(indices) < _span(indices) \
        else f"{indices[0]}-{indices[-1]}"
    if options.max_parallel:
        spec += f"%{options.max_parallel}"
    argv = ["sbatch", "--parsable", f"--array={spec}", f"--job-name={options.job_name}",
            f"--output={work / LOGS / f'task-{offset}+%a.out'}", f"--chdir={options.workdir}",
            "--ntasks=1", "--cpus-per-task=1"]
    if options.partition:
        argv.append(f"--partition={options.partition}")
    argv += [str(work / "array.sh"), str(offset)]
    return argv


def _span(indices: Sequence[int]) -> int:
    return indices[-1] - indices[0] + 1 if indices else 0


def _slurm(argv: list[str], options: SlurmOptions) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              env=dict(options.env) if options.env is not None else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmSweepError(f"{argv[0]} failed: {exc}") from None


def submit(work: Path, indices: Sequence[int], options: SlurmOptions) -> list[str]:
    """One array per chunk of ``indices``; their job ids."""
    script = work / "array.sh"
    script.write_text(array_script(work, options))
    script.chmod(0o755)
    ids: list[str] = []
    for offset, group in chunks(indices, options.max_array):
        proc = _slurm(sbatch_argv(work, offset, group, options), options)
        if proc.returncode != 0:
            for job_id in ids:
                _slurm(["scancel", job_id], options)
            raise SlurmSweepError(f"sbatch exited {proc.returncode}: {proc.stderr.strip()}")
        ids.append(proc.stdout.strip().split(";")[0])  # --parsable: "jobid[;cluster]"
    return ids


def in_queue(job_id: str, options: SlurmOptions) -> bool:
    """Whether any task of the array is still pending or running. A job that slurmctld has
    already forgotten (``Invalid job id``) has left the queue."""
    proc = _slurm(["squeue", "-h", "-j", job_id, "-o", "%i %T"], options)
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return False
        raise SlurmSweepError(f"squeue exited {proc.returncode}: {proc.stderr.strip()}")
    return bool(proc.stdout.strip())


def wait(job_ids: Sequence[str], work: Path, total: int, options: SlurmOptions,
         progress: Callable[[int, int], None] | None = None) -> None:
    deadline = time.monotonic() + options.timeout_s
    while any(in_queue(job_id, options) for job_id in job_ids):
        if progress:
            progress(len(list((work / RESULTS).glob("result-*.json"))), total)
        if time.monotonic() > deadline:
            for job_id in job_ids:
                _slurm(["scancel", job_id], options)
            raise SlurmSweepError(f"arrays {', '.join(job_ids)} still queued after "
                                  f"{options.timeout_s:g} s; cancelled")
        time.sleep(options.poll_s)


def missing(work: Path, total: int) -> list[int]:
    return [i for i in range(total) if not result_path(work, i).exists()]


def run_on_slurm(all_tasks: Sequence[Task], work: Path, options: SlurmOptions | None = None,
                 progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Run every task as one array task; the rows in task order (as ``run_sweep``)."""
    options = options or SlurmOptions()
    if not all_tasks:
        return []
    work = work.resolve()
    write_tasks(work, all_tasks)
    todo = list(range(len(all_tasks)))
    for _ in range(options.retries + 1):
        job_ids = submit(work, todo, options)
        wait(job_ids, work, len(all_tasks), options, progress)
        todo = missing(work, len(all_tasks))
        if not todo:
            break
    if todo:
        logs = str(work / LOGS / "task-OFFSET+INDEX.out")
        raise SlurmSweepError(f"{len(todo)} of {len(all_tasks)} tasks left no result after "
                              f"{options.retries} retries (tasks {todo[:10]}; logs: {logs})")
    if progress:
        progress(len(all_tasks), len(all_tasks))
    return [json.loads(result_path(work, i).read_text()) for i in range(len(all_tasks))]


def run_one(tasks_file: Path, results: Path, index: int) -> Path:
    """What one array task does: run task ``index`` and write its row atomically (a task
    killed half-way leaves no result, so the parent resubmits it)."""
    data = json.loads(tasks_file.read_text())
    if not 0 <= index < len(data):
        raise SystemExit(f"task index {index} out of range (0..{len(data) - 1})")
    row = run_task(load_task(data[index]))
    out = results / f"result-{index:06d}.json"
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(row, default=str))
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "task" or not args[3].isdigit():
        print("usage: python -m simulator.sweep_slurm task TASKS_JSON RESULTS_DIR INDEX",
              file=sys.stderr)
        return 2
    run_one(Path(args[1]), Path(args[2]), int(args[3]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
