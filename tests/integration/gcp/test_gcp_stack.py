"""`make stack` end to end: the emulators, every function as its own functions-framework
server (MTC_BACKEND=gcp), Pub/Sub push, LocalCompute with real worker processes, and the
self-healing story; everything it started is gone afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gcp_support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _pids_of(pattern: str) -> set[int]:
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


def test_stack_tells_the_self_healing_story(emulators: dict[str, str],
                                            tmp_path: Path) -> None:
    state = tmp_path / "stack"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST")}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "stack.py"), "--state-dir",
                             str(state), "--steps", "80"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, "COLUMNS": "200"},
                            cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the stack stops what it started, by PID
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the stack took over 300 s:\n{out[-4000:]}\n{err[-2000:]}")
    assert proc.returncode == 0, out[-4000:] + err[-4000:]
    for line in ("diagnosed gpu_fell_off_bus", "draining, job train-1 must checkpoint",
                 "attempt 1 workers exited, code", "requeued (restart 1)",
                 "attempt 2 started", "resuming from checkpoint step", "repair started: reboot",
                 "back in service", "JOB_STATE_SUCCEEDED after 1 restart(s)",
                 "via pubsub", "stopped functions", "stopped pubsub", "stopped firestore",
                 # the story went through the Vertex AI API: an Operation waited on, a job
                 # submitted with its customJobId, the node list read back
                 "locations/us-central1/modelDevelopmentClusters/demo READY",
                 "locations/us-central1/customJobs/train-1 submitted",
                 "GET .../modelDevelopmentClusters/demo/nodes"):
        timeline = "\n".join(x for x in out.splitlines() if "via pubsub" in x or ">>>" in x)
        assert line in out, f"missing {line!r} in:\n{timeline}"
    assert not _pids_of(str(state)), "something the stack started is still running"
