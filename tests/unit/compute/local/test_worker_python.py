"""`python` in a worker's command is the interpreter mtc runs in (with its
packages, cloudml-hypertune among them), not whichever `python` the server's PATH finds
first: six tuning trials ended INFEASIBLE on `No module named 'hypertune'`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.compute.local.compute import LocalCompute
from shared.ports import WorkerSpec


def _spec(env: tuple[tuple[str, str], ...] = ()) -> WorkerSpec:
    return WorkerSpec("j1", 1, 0, 1, "n0", ("python", "-c", "pass"), env, "/tmp/c", "/tmp/m",
                      "/tmp/l")


def test_python_in_a_command_is_mtcs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a server started without its venv on PATH
    compute = LocalCompute(tmp_path, lambda _: None, SystemClock(), heartbeats=False)
    try:
        env = compute.worker_env(_spec())
        found = shutil.which("python", path=env["PATH"])
        assert found is not None
        assert Path(found).parent == Path(sys.executable).parent
        done = subprocess.run([found, "-c", "import hypertune"], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert env["PATH"].endswith("/usr/bin:/bin")
        mine = compute.worker_env(_spec((("PATH", "/opt/mine"),)))
        assert mine["PATH"] == "/opt/mine"  # a job that sets PATH keeps it
    finally:
        compute.close()
