"""The generated batch scripts: job input is data, never shell code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.adapters.compute.protocol import read_exit_file
from shared.adapters.compute.slurm_scripts import write_scripts
from shared.ports import Gang, LaunchGroup

NASTY = "$(touch PWNED) `touch PWNED2` 'single' \"double\" ; touch PWNED3 \\ $HOME\nnext line"


def gang(tmp: Path, env: tuple[tuple[str, str], ...], job_id: str = "job-1") -> Gang:
    out = tmp / "out"
    command = (sys.executable, "-c", "import os; open('seen', 'w').write(os.environ['PAYLOAD'])")
    return Gang(job_id, 1, ("w0",), (LaunchGroup(0, 1, command, env),), str(out / "c"), str(out / "m"),
                str(out / "t"))


def test_env_name_injection_is_refused_and_quoted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    work = tmp_path / "work"
    work.mkdir()
    # a bad name is refused, and nothing is written
    for bad in ("X; touch PWNED; Y", "1X", "A-B", "A B", "X=Y", "", "A\nB", "$(touch PWNED)"):
        with pytest.raises(ValueError, match="invalid environment variable name"):
            write_scripts(gang(tmp_path, ((bad, "v"),)), {"w0": "n1"}, run_dir,
                          tmp_path / "slurm.out", python=sys.executable, master_addr="127.0.0.1")
        assert not (run_dir / "task.sh").exists()
    # a hostile value (and job id) stays literal
    job_id = "j$(touch PWNED4)\ntouch PWNED5"
    write_scripts(gang(tmp_path, (("PAYLOAD", NASTY),), job_id), {"w0": "n1"}, run_dir,
                  tmp_path / "slurm.out", python=sys.executable, master_addr="127.0.0.1")
    for name in ("task.sh", "batch.sh"):
        check = subprocess.run(["bash", "-n", str(run_dir / name)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
    bin_dir = tmp_path / "bin"  # a stand-in srun: runs the step's one task as task 0
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nexec bash "${@: -1}"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "SLURM_PROCID": "0",
           "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1"}
    done = subprocess.run(["bash", str(run_dir / "batch.sh")], cwd=work, env=env, timeout=30,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "$(touch PWNED4)" in done.stdout  # the job id, echoed literally
    assert read_exit_file(run_dir / "rank-0.exit") == 0
    assert (work / "seen").read_text() == NASTY
    assert not list(work.glob("PWNED*")) and not list(tmp_path.glob("PWNED*"))
