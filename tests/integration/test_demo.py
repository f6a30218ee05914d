"""`make demo` tells the whole self-healing story, in order, in under a minute."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # `mtc demo` as a subprocess: real worker processes

ROOT = Path(__file__).resolve().parents[2]

STORY = [
    "cluster demo: ready",
    "attempt 1 started",
    "injecting XID 79",
    "diagnosed gpu_fell_off_bus (critical) -> reboot",
    "draining, job train-1 must checkpoint",
    "SIGTERM to attempt 1",
    "attempt 1 workers exited, code 75",
    "requeued (restart 1)",
    "repair started: reboot",
    "attempt 2 started",
    "resuming from checkpoint step",
    "reboot done",
    "back in service",
    "JOB_STATE_SUCCEEDED after 1 restart(s)",
    "goodput: runtime",
    # the checkpoint tiers: an XID 13 restarts in place, a lost node is hot-swapped
    "train-2: attempt 1 started",
    "injecting XID 13",
    "recovery in_place for attempt 1 (app_restart)",
    "attempt 2 started on",
    "from the memory tier",
    "lost (heartbeat gone",
    "recovery hot_swap for attempt 2",
    "attempt 3 started on",
    "train-2: JOB_STATE_SUCCEEDED after 2 restart(s)",
]


def test_demo_shows_the_story_in_order(tmp_path: Path) -> None:
    env = {**os.environ, "MTC_STATE_DIR": str(tmp_path / "demo"), "COLUMNS": "200"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "services.cli.main", "demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    cursor = 0
    for line in STORY:  # each step must appear after the one before it
        found = out.find(line, cursor)
        assert found >= 0, f"{line!r} missing after position {cursor}\n{out}"
        cursor = found + len(line)
    assert "restarts: 1" in out and "0 step(s) recomputed" in out
    assert elapsed < 60
