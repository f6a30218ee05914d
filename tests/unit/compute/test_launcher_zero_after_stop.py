"""Under srun --kill-on-bad-exit a rank that checkpointed and left after the drain's SIGTERM
must not kill the ranks still saving theirs: the launcher reports 0 to srun once asked to
stop, and keeps the real code in its exit file; a rank that fails on its own still fails."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[3] / "shared/adapters/compute/worker_launcher.py"
pytestmark = pytest.mark.slow  # the launcher and its child as real processes
CHILD = ("import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
         "print('ready', flush=True)\n"
         "time.sleep(30)\n"
         "sys.exit(3)\n")


def launch(tmp_path: Path, *flags: str, code: str = CHILD) -> tuple[subprocess.Popen[str], Path]:
    exit_file = tmp_path / "rank-0.exit"
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), *flags, "--exit-file", str(exit_file),
                             "--", sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc, exit_file


@pytest.mark.parametrize("flags, srun_sees", [(("--zero-after-stop",), 0), ((), 75)])
def test_a_stopped_rank_does_not_end_the_gang(tmp_path: Path, flags: tuple[str, ...],
                                              srun_sees: int) -> None:
    proc, exit_file = launch(tmp_path, *flags)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == srun_sees
    assert exit_file.read_text().strip() == "75"


def test_a_rank_failing_on_its_own_still_fails(tmp_path: Path) -> None:
    proc, exit_file = launch(tmp_path, "--zero-after-stop",
                             code="print('ready', flush=True)\nraise SystemExit(7)\n")
    assert proc.wait(timeout=10) == 7
    assert exit_file.read_text().strip() == "7"
