"""A node finding the ranks it runs by their environment, and its hang watch over them (a
real process with a managed environment, SIGSTOPped)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.adapters.compute import node_hangs, proc_watch
from shared.adapters.compute.node_hangs import NodeHangWatch, RankEnv, node_attempts, rank_env
from shared.adapters.compute.proc_watch import ProcWatch
from shared.policies.process_hangs import ProcessHangConfig

PROGRAM = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.05)\n"


def env(job: str = "j", attempt: int = 1, rank: int = 0, node: str = "n1") -> RankEnv:
    return RankEnv(job, attempt, rank, node, "/ckpt", f"/progress/{rank}")


def environ(**values: str) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in values.items())


def test_rank_env_reads_the_managed_environment_and_refuses_the_rest() -> None:
    full = {"CLOUD_ML_JOB_ID": "j", "MTC_JOB_ATTEMPT": "3", "RANK": "1", "MTC_NODE_ID": "n2",
            "AIP_CHECKPOINT_DIR": "/c", "MTC_PROGRESS_FILE": "/p", "X": "a=b"}
    assert rank_env(environ(**full)) == RankEnv("j", 3, 1, "n2", "/c", "/p")
    for missing in ("CLOUD_ML_JOB_ID", "MTC_JOB_ATTEMPT", "RANK", "MTC_NODE_ID"):
        assert rank_env(environ(**{k: v for k, v in full.items() if k != missing})) is None
    assert rank_env(environ(**{**full, "RANK": "x"})) is None  # no number: no rank
    assert rank_env(b"") is None


def test_node_attempts_takes_each_ranks_topmost_process_on_this_node_only() -> None:
    procs = {
        10: (1, env(rank=0)),  # rank 0's root (its parent carries no rank)
        11: (10, env(rank=0)),  # its child: same rank, not a root
        20: (1, env(rank=1)),
        21: (20, env(rank=2)),  # a child of another rank's process is its own rank's root
        30: (1, env(rank=3, node="n2")),  # another node's
        40: (1, env(job="k", attempt=2, rank=0)),
        41: (1, env(rank=0)),  # a second root of rank 0: the oldest (lowest pid) stands
    }
    found = node_attempts(procs, "n1")
    assert set(found) == {("j", 1), ("k", 2)}
    assert dict(found[("j", 1)].roots) == {0: 10, 1: 20, 2: 21}
    assert found[("j", 1)].checkpoint_dir == "/ckpt"
    assert found[("j", 1)].progress_files == ("/progress/0", "/progress/1", "/progress/2")
    assert dict(found[("k", 2)].roots) == {0: 40}
    assert node_attempts(procs, "n9") == {}


def test_a_rank_held_warm_from_an_earlier_attempt_counts_for_the_newest() -> None:
    procs = {
        10: (1, env(attempt=1, rank=0)),  # held warm: its environment names attempt 1
        20: (1, env(attempt=1, rank=1)),  # rank 1's old process, still exiting
        21: (1, env(attempt=2, rank=1)),  # rank 1 started afresh for attempt 2
    }
    (key, found), = node_attempts(procs, "n1").items()
    assert key == ("j", 2) and dict(found.roots) == {0: 10, 1: 21}


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, str]]:
    """A plain program running as rank 1 of job ``job`` on node ``node`` (unique names: the
    host's other processes are never mistaken for it)."""
    node = f"node-{os.getpid()}-{time.monotonic_ns()}"
    log = tmp_path / "slurm.out"
    managed = {"CLOUD_ML_JOB_ID": "job", "MTC_JOB_ATTEMPT": "1", "RANK": "1",
               "MTC_NODE_ID": node, "AIP_CHECKPOINT_DIR": str(tmp_path / "c"),
               "MTC_PROGRESS_FILE": str(tmp_path / "progress-1.json")}
    with open(log, "wb") as out:
        child = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=out,
                                 env={**os.environ, **managed})
    try:
        yield child, log, node
    finally:
        with contextlib.suppress(OSError):
            os.kill(child.pid, signal.SIGKILL)
        child.wait()


def test_a_stopped_rank_found_by_its_environment_is_reported_on_its_node(
        rank: tuple[subprocess.Popen[bytes], Path, str]) -> None:
    child, log, node = rank
    watch = NodeHangWatch(log_of=lambda job: str(log),
                          new_watch=lambda: ProcWatch(ProcessHangConfig(stopped_s=5.0)))
    wait_for(lambda: any(pid == child.pid for pid, _, _ in node_hangs.managed_processes()))
    assert watch.conditions(node, 1000.0) == ()
    assert watch.conditions("another-node", 1000.0) == ()  # not its rank
    assert "another-node" not in watch.watches  # nothing seen: no state kept
    os.kill(child.pid, signal.SIGSTOP)
    wait_for(lambda: (proc_watch.read_stat(child.pid) or ("",))[0] == "T")
    assert watch.conditions(node, 1002.0) == ()  # stopped: its clock starts
    (cond,) = watch.conditions(node, 1008.0)
    assert cond["type"] == "HangInJob" and cond["status"] == "true"
    assert cond["details"]["culprit"] == 1 and cond["details"]["node"] == node
    assert cond["details"]["job_id"] == "job" and cond["details"]["attempt"] == 1
    assert f"rank 1 process {child.pid} stopped" in cond["reason"] and node in cond["reason"]
    assert watch.conditions(node, 1010.0) == ()  # once per attempt


def test_a_program_reporting_progress_is_left_to_rank_progress(
        rank: tuple[subprocess.Popen[bytes], Path, str], tmp_path: Path) -> None:
    child, log, node = rank
    (tmp_path / "progress-1.json").write_text("{}")
    watch = NodeHangWatch(log_of=lambda job: str(log),
                          new_watch=lambda: ProcWatch(ProcessHangConfig(stopped_s=1.0)))
    wait_for(lambda: any(pid == child.pid for pid, _, _ in node_hangs.managed_processes()))
    os.kill(child.pid, signal.SIGSTOP)
    wait_for(lambda: (proc_watch.read_stat(child.pid) or ("",))[0] == "T")
    assert watch.conditions(node, 10.0) == ()
    assert watch.conditions(node, 20.0) == ()
    assert watch.watches[node].attempts == {}


def test_an_attempt_gone_from_the_node_is_forgotten(
        rank: tuple[subprocess.Popen[bytes], Path, str]) -> None:
    child, log, node = rank
    watch = NodeHangWatch(log_of=lambda job: str(log))
    wait_for(lambda: any(pid == child.pid for pid, _, _ in node_hangs.managed_processes()))
    watch.conditions(node, 10.0)
    assert ("job", 1) in watch.watches[node].attempts
    child.kill()
    child.wait()
    assert watch.conditions(node, 20.0) == ()
    assert watch.watches[node].attempts == {}
