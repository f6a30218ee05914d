"""The Slurm sweep's pieces that need no cluster: the generated script quotes every path,
the array spec, and one array task's own command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import sweep, sweep_slurm

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "simulator" / "scenarios" / "small.yaml"


def test_the_array_script_quotes_every_path(tmp_path: Path) -> None:
    work = tmp_path / "it's a $(touch pwned) dir"
    options = sweep_slurm.SlurmOptions(python="/opt/my python/bin/python3",
                                       workdir=tmp_path / "checkout; rm -rf ~")
    script = sweep_slurm.array_script(work, options)
    assert "'/opt/my python/bin/python3'" in script
    assert "cd '" in script and "; rm -rf ~'" in script
    # bash parses it, and the words it would run are the paths, whole
    path = tmp_path / "a.sh"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    traced = subprocess.run(["bash", "-c", script.replace("exec ", "printf '%s\\n' ")
                             .replace("set -euo pipefail", "set -u; SLURM_ARRAY_TASK_ID=3")
                             .replace("cd '", ": '"), "array.sh", "1000"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert traced == ["/opt/my python/bin/python3", "-m", "simulator.sweep_slurm", "task",
                      str(work / "tasks.json"), str(work / "results"), "1003"]
    assert not (Path("/") / "pwned").exists()


def test_sbatch_gets_an_argv_with_a_range_or_the_list_left(tmp_path: Path) -> None:
    opts = sweep_slurm.SlurmOptions(partition="main", max_parallel=4)
    argv = sweep_slurm.sbatch_argv(tmp_path, 0, [0, 1, 2, 3], opts)
    assert argv[0] == "sbatch" and "--array=0-3%4" in argv and "--partition=main" in argv
    assert argv[-2:] == [str(tmp_path / "array.sh"), "0"]
    assert "--array=1,3%4" in sweep_slurm.sbatch_argv(tmp_path, 0, [1, 3], opts)


def test_big_sweeps_split_into_arrays_below_max_array_size() -> None:
    assert sweep_slurm.chunks(range(5), 1000) == [(0, [0, 1, 2, 3, 4])]
    assert sweep_slurm.chunks(range(2500), 1000) == [
        (0, list(range(1000))), (1000, list(range(1000))), (2000, list(range(500)))]
    # retries: only the missing tasks, each chunk from its own first index
    assert sweep_slurm.chunks([3, 7, 1500, 1999, 2600], 1000) == [
        (3, [0, 4]), (1500, [0, 499]), (2600, [0])]


@pytest.mark.slow
def test_one_array_task_writes_the_row_a_local_run_gives(tmp_path: Path) -> None:
    tasks = sweep.tasks(str(SMALL), [("spares", ["0", "4"])], 1, 3, {"duration": "12h"})
    sweep_slurm.write_tasks(tmp_path, tasks)
    (tmp_path / "results" / "result-000009.json").write_text("{}")  # an earlier sweep's
    sweep_slurm.write_tasks(tmp_path, tasks)
    assert sweep_slurm.missing(tmp_path, 2) == [0, 1]
    subprocess.run([sys.executable, "-m", "simulator.sweep_slurm", "task",
                    str(tmp_path / "tasks.json"), str(tmp_path / "results"), "1"],
                   cwd=REPO, check=True, timeout=120,
                   env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert sweep_slurm.missing(tmp_path, 2) == [0]
    row = json.loads(sweep_slurm.result_path(tmp_path, 1).read_text())
    local = sweep.run_task(tasks[1])
    assert {k: v for k, v in row.items() if k != "wall_s"} == \
        {k: v for k, v in local.items() if k != "wall_s"}
    assert row["spares"] == "4" and row["seed"] == 3
    bad = subprocess.run([sys.executable, "-m", "simulator.sweep_slurm", "task",
                          str(tmp_path / "tasks.json"), str(tmp_path / "results"), "7"],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert bad.returncode != 0 and "out of range" in bad.stderr
