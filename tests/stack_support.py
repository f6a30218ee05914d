"""Running a stack script (scripts/stack.py, scripts/stack_slurm.py) from a test, and
checking afterwards that nothing it started is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pids_of(pattern: str) -> set[int]:
    """Processes whose command line mentions ``pattern`` (a test's own state dir)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if pattern in cmdline:
                out.add(int(entry.name))
    return out


def run_script(script: str, *args: str, timeout_s: float, drop_env: tuple[str, ...] = (),
               folder: str = "scripts") -> str:
    """Run ``<folder>/<script>`` (``scripts/`` or ``bench/``) to its end, without the test's
    emulators in its environment (it starts its own); its stdout. Past ``timeout_s`` it is
    sent SIGTERM (it stops what it started, by PID) and the test fails; a non-zero exit
    fails the test with its output."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", *drop_env)}
    proc = subprocess.Popen([sys.executable, str(ROOT / folder / script), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "COLUMNS": "200"}, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
        pytest.fail(f"{script} took over {timeout_s:g} s:\n{out[-4000:]}\n{err[-2000:]}")
    assert proc.returncode == 0, out[-5000:] + err[-3000:]
    return out
