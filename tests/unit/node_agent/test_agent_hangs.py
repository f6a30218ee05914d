"""``mtc-agent --interval`` watching its node's ranks: a stopped rank of a managed job goes out
in the agent's own report as ``HangInJob`` on its node (a real process, SIGSTOPped)."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.node_agent.cli import main
from shared.adapters.compute import proc_watch
from shared.adapters.compute.node_hangs import stuck_only

PROGRAM = "import time\nwhile True:\n    time.sleep(0.05)\n"


@pytest.fixture
def stopped(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """Rank 0 of job ``job`` on a node named for this test alone, stopped."""
    node = f"agent-node-{os.getpid()}-{time.monotonic_ns()}"
    managed = {"CLOUD_ML_JOB_ID": "job", "MTC_JOB_ATTEMPT": "2", "RANK": "0",
               "MTC_NODE_ID": node, "AIP_CHECKPOINT_DIR": str(tmp_path / "c"),
               "MTC_PROGRESS_FILE": str(tmp_path / "progress-0.json")}
    child = subprocess.Popen([sys.executable, "-c", PROGRAM], env={**os.environ, **managed})
    try:
        deadline = time.monotonic() + 20
        while b"MTC_NODE_ID" not in Path(f"/proc/{child.pid}/environ").read_bytes():
            assert time.monotonic() < deadline  # (the exec has not happened yet)
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGSTOP)
        while (proc_watch.read_stat(child.pid) or ("",))[0] != "T":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield child.pid, node
    finally:
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGKILL)
        child.wait()


def test_the_running_agent_reports_its_nodes_stopped_rank(stopped: tuple[int, str]) -> None:
    pid, node = stopped
    out = io.StringIO()
    ticks = itertools.count(1000.0, 1.0)  # every reading of the clock: one second later
    code = main(["--interval", "1", "--node-id", node, "--skip", "xid,nvidia_smi,dcgm,disk,speed"],
                clock=lambda: next(ticks), sleep=lambda s: None, stdout=out,
                environ={"MTC_HANG_STOPPED_S": "2"}, max_iterations=3)
    assert code == 0
    reports = [json.loads(line) for line in out.getvalue().splitlines()]
    hangs = [(r, c) for r in reports for c in r["conditions"] if c["type"] == "HangInJob"]
    ((report, cond),) = hangs  # once per attempt
    assert report["node_id"] == node and report["source"] == "agent"
    assert cond["status"] == "true" and cond["details"]["culprit"] == 0
    assert cond["details"]["job_id"] == "job" and cond["details"]["attempt"] == 2
    assert f"rank 0 process {pid} stopped" in cond["reason"]


def test_one_check_watches_no_ranks(stopped: tuple[int, str]) -> None:
    _, node = stopped
    out = io.StringIO()
    main(["--once", "--node-id", node, "--skip", "xid,nvidia_smi,dcgm,disk,speed"],
         stdout=out, environ={"MTC_HANG_STOPPED_S": "0"})
    assert "HangInJob" not in out.getvalue()


def test_the_agents_watch_judges_by_stuck_states_alone() -> None:
    watch = stuck_only({"MTC_HANG_STOPPED_S": "7"})
    assert watch.config.stopped_s == 7.0 and watch.config.quiet_s == math.inf
