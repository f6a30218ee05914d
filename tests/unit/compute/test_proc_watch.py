"""Reading a rank's processes from /proc: a real child process, SIGSTOPped."""

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

from shared.adapters.compute import proc_watch
from shared.adapters.compute.proc_watch import ProcWatch, RankProc
from shared.policies.process_hangs import ProcessHangConfig

# a parent (a stand-in for the launcher) whose child is the program, writing output
PROGRAM = "import sys, time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.05)\n"
PARENT = ("import subprocess, sys\n"
          f"subprocess.run([sys.executable, '-c', {PROGRAM!r}], stdout=sys.stdout)\n")


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    log = tmp_path / "rank-1.log"
    with open(log, "wb") as out:
        parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=out)
    try:
        yield parent, log
    finally:
        for pid in proc_watch.tree(parent.pid, proc_watch.children_map()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        parent.wait()


def child_of(pid: int) -> int:
    wait_for(lambda: bool(proc_watch.children_map().get(pid)))
    return proc_watch.children_map()[pid][0]


def test_a_stopped_program_is_sampled_as_stopped_under_its_sleeping_launcher(
        rank: tuple[subprocess.Popen[bytes], Path]) -> None:
    parent, log = rank
    child = child_of(parent.pid)
    wait_for(lambda: log.stat().st_size > 0)
    stat = proc_watch.read_stat(child)
    assert stat is not None and stat[0] in "RS" and stat[1] == parent.pid
    os.kill(child, signal.SIGSTOP)
    wait_for(lambda: (proc_watch.read_stat(child) or ("",))[0] == "T")
    got = proc_watch.sample(1, RankProc(parent.pid, str(log), "n1"), proc_watch.children_map())
    assert got is not None and (got.rank, got.state, got.pid) == (1, "T", child)
    assert got.cpu_s >= 0.0 and got.output_bytes == log.stat().st_size
    assert proc_watch.read_stat(2 ** 22 + 7) is None  # gone (beyond pid_max's default)


def test_a_stopped_rank_is_reported_as_a_hang_on_its_node_with_its_stack(
        rank: tuple[subprocess.Popen[bytes], Path], tmp_path: Path) -> None:
    parent, log = rank
    child = child_of(parent.pid)
    peer_log = tmp_path / "rank-0.log"
    peer_log.write_text("[E ProcessGroupGloo.cpp:143] Gloo connectFullMesh failed: "
                        "Timed out waiting 1800000ms for recv operation to complete\n")
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _stopped_rank_reported(child, ranks={0: RankProc(peer.pid, str(peer_log), "n0"),
                                             1: RankProc(parent.pid, str(log), "n1")},
                               where=tmp_path)
    finally:
        peer.kill()
        peer.wait()


def _stopped_rank_reported(child: int, ranks: dict[int, RankProc], where: Path) -> None:
    tmp_path = where
    watch = ProcWatch(ProcessHangConfig(stopped_s=5.0))
    assert watch.scan("j", 1, ranks, str(tmp_path), 1000.0) == []
    os.kill(child, signal.SIGSTOP)
    wait_for(lambda: (proc_watch.read_stat(child) or ("",))[0] == "T")
    assert watch.scan("j", 1, ranks, str(tmp_path), 1002.0) == []  # stopped: its clock starts
    assert watch.scan("j", 1, ranks, str(tmp_path), 1006.0) == []  # not past the limit yet
    (report,) = watch.scan("j", 1, ranks, str(tmp_path), 1008.0)
    assert report.node_id == "n1"
    (cond,) = report.conditions
    assert cond["type"] == "HangInJob" and cond["status"] == "true"
    details = cond["details"]
    assert details["culprit"] == 1 and details["node"] == "n1"
    assert f"rank 1 process {child} stopped" in cond["reason"] and "n1" in cond["reason"]
    # py-spy's dump of the program (installed here), or why not: never a made-up stack
    assert "<module>" in details["stack"] or details["stack"].startswith("stack: unknown (")
    assert any("Timed out waiting" in s and s.startswith("rank 0:")
               for s in details["torch_signals"])
    assert watch.scan("j", 1, ranks, str(tmp_path), 1010.0) == []  # once per attempt


def test_without_py_spy_the_stack_is_unknown_with_the_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr(proc_watch, "_beside_python", lambda name: None)
    assert proc_watch.python_stack(os.getpid()).startswith(
        "stack: unknown (py-spy is not installed")


def test_py_spy_failing_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr("shutil.which", lambda name: str(fake))
    assert proc_watch.python_stack(os.getpid()) == (
        "stack: unknown (py-spy: Error: Permission denied (os error 13))")


def test_a_later_attempt_writing_output_lifts_the_hang(
        rank: tuple[subprocess.Popen[bytes], Path], tmp_path: Path) -> None:
    parent, log = rank
    watch = ProcWatch(ProcessHangConfig(stopped_s=1.0))
    watch.hung_on["j"] = {"n1"}
    ranks = {0: RankProc(parent.pid, str(log), "n1")}
    size = log.stat().st_size
    assert watch.scan("j", 2, ranks, str(tmp_path), 10.0) == []
    wait_for(lambda: log.stat().st_size > size)
    (report,) = watch.scan("j", 2, ranks, str(tmp_path), 12.0)
    assert report.node_id == "n1" and report.conditions[0]["status"] == "false"


def test_the_thresholds_come_from_the_nodes_environment() -> None:
    cfg = proc_watch.config_from_env({"MTC_HANG_STOPPED_S": "7", "MTC_HANG_QUIET_S": "120"})
    assert (cfg.stopped_s, cfg.quiet_s, cfg.uninterruptible_s) == (7.0, 120.0, 60.0)


def test_one_listing_of_proc_serves_every_attempt_of_a_poll(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    listings: list[int] = []
    real = proc_watch.children_map

    def counted() -> dict[int, list[int]]:
        listings.append(1)
        return real()

    monkeypatch.setattr(proc_watch, "children_map", counted)
    watch = ProcWatch(config=ProcessHangConfig())
    ranks = {0: RankProc(os.getpid(), str(tmp_path / "r0.log"), "n0")}
    for job in ("a", "b", "c"):
        watch.scan(job, 1, ranks, str(tmp_path), now=100.0)
    assert len(listings) == 1
    watch.scan("a", 1, ranks, str(tmp_path), now=102.0)  # the next poll lists again
    assert len(listings) == 2
