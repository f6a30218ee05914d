"""`mtc bench recovery --target slurm` without a cluster: the rank finder over real processes,
the per-attempt log cut, the skip of a fault a target cannot play, the root refusal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from services.cli.bench_live import LiveRun, LocalFaults, attempt_logs, attempt_section
from services.cli.bench_report import print_table
from services.cli.bench_slurm import NODE_LOST_SKIPPED, SlurmFaults, rank_pids
from services.cli.main import main
from services.wiring.embedded import embedded
from shared.adapters.compute.protocol import LAUNCHER
from shared.domain.errors import ValidationError
from shared.resilience.trace import Fault, FaultKind, load_trace

SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _spawn(procs: list[subprocess.Popen[bytes]], argv: list[str], **env: str
           ) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(argv, env={**os.environ, **env})
    procs.append(p)
    return p


@pytest.mark.slow  # real processes
def test_rank_pids_finds_the_program_of_the_rank_not_its_launcher_or_others(
        procs: list[subprocess.Popen[bytes]]) -> None:
    job = f"bench-test-{os.getpid()}"
    mine = {"CLOUD_ML_JOB_ID": job, "MTC_NODE_ID": "bench-h100-001", "MTC_JOB_ATTEMPT": "2"}
    program = _spawn(procs, [sys.executable, "-c", SLEEP], **mine)
    _spawn(procs, [sys.executable, "-c", SLEEP, str(LAUNCHER)], **mine)  # the launcher
    _spawn(procs, [sys.executable, "-c", SLEEP], **{**mine, "MTC_NODE_ID": "bench-h100-002"})
    # went on in place from attempt 1: /proc shows the environment it started with
    went_on = _spawn(procs, [sys.executable, "-c", SLEEP], **{**mine, "MTC_JOB_ATTEMPT": "1"})
    _spawn(procs, [sys.executable, "-c", SLEEP], **{**mine, "MTC_JOB_ATTEMPT": "3"})
    _spawn(procs, [sys.executable, "-c", SLEEP], **{**mine, "CLOUD_ML_JOB_ID": job + "-x"})
    want = sorted([program.pid, went_on.pid])
    deadline = time.monotonic() + 5
    while rank_pids(job, 2, "bench-h100-001") != want and time.monotonic() < deadline:
        time.sleep(0.05)  # /proc/<pid>/environ is there once the child has exec'd
    assert rank_pids(job, 2, "bench-h100-001") == want


@pytest.mark.slow  # real processes
def test_slurm_faults_kill_the_rank_and_skip_node_lost(
        procs: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    job = f"bench-kill-{os.getpid()}"
    env = {"CLOUD_ML_JOB_ID": job, "MTC_NODE_ID": "n-a", "MTC_JOB_ATTEMPT": "1"}
    program = _spawn(procs, [sys.executable, "-c", SLEEP], **env)
    other = _spawn(procs, [sys.executable, "-c", SLEEP], **{**env, "MTC_NODE_ID": "n-b"})
    deadline = time.monotonic() + 5
    while not rank_pids(job, 1, "n-a") and time.monotonic() < deadline:
        time.sleep(0.05)

    class _App:
        compute = None

    faults = SlurmFaults(_App())  # type: ignore[arg-type]
    faults.kill_ranks(job, 1, "n-a")
    assert program.wait(timeout=5) == -9
    assert other.poll() is None  # another node's rank lives on
    assert faults.cannot(FaultKind.NODE_LOST) == NODE_LOST_SKIPPED
    assert faults.cannot(FaultKind.APP_CRASH) is None
    assert faults.attempt_whole(job, 1) is False


SLURM_LOG = """[mtc] job bench-train attempt 1: Slurm job 7 on n[1-4]
[bench-train rank 0/4] no checkpoint found: starting from step 0
[mtc] job bench-train attempt 1: srun exited 137
[mtc] job bench-train attempt 2: Slurm job 8 on n[1-4]
[bench-train rank 0/4] restoring step 45 from the memory tier (/dev/shm/x) in 0.01 s
[bench-train rank 0/4] step 50 loss 0.1
[mtc] job bench-train attempt 3: Slurm job 9 on n[1-3],c1
[bench-train rank 0/4] resumed from step 60
"""


def test_attempt_section_cuts_one_output_shared_by_attempts() -> None:
    assert "starting from step 0" in attempt_section(SLURM_LOG, 1)
    assert "srun exited 137" in attempt_section(SLURM_LOG, 1)
    two = attempt_section(SLURM_LOG, 2)
    assert "restoring step 45" in two and "step 0" not in two and "step 60" not in two
    assert attempt_section(SLURM_LOG, 3).endswith("resumed from step 60\n")
    assert attempt_section("no marks here\n", 5) == "no marks here\n"  # a log of its own


def test_live_run_reads_each_attempts_restore_from_one_shared_log(tmp_path: Path) -> None:
    log = tmp_path / "slurm-out.log"
    log.write_text(SLURM_LOG)

    class _LogFile:
        def __init__(self, attempt: int) -> None:
            self.attempt, self.rank, self.path = attempt, None, str(log)

    class _Compute:
        def log_files(self, job_id: str) -> list[_LogFile]:
            return [_LogFile(a) for a in (1, 2, 3)]

    texts = attempt_logs(_Compute(), "bench-train")
    assert sorted(texts) == [1, 2, 3]
    app = embedded(tmp_path / "state")
    try:
        run = LiveRun(app, load_trace("two-faults"), pin=None, timeout_s=1)
        app.compute = _Compute()  # the Slurm adapter's one output, for every attempt
        assert run.resumes() == {2: 45, 3: 60}
        assert run.resumes(2) == {2: 45}
    finally:
        app.close()


def test_a_fault_the_target_cannot_play_is_skipped_with_its_reason(tmp_path: Path) -> None:
    app = embedded(tmp_path / "state")
    try:
        faults = SlurmFaults(app)
        run = LiveRun(app, load_trace("two-faults"), pin=None, timeout_s=1, faults=faults)
        fault = Fault(FaultKind.NODE_LOST, at_s=1.0, after_step=None, rank=0, node=None)
        assert run._inject(3, fault) is False
        assert run.injected == []
        assert run.skipped == [{"index": 3, "kind": "node_lost", "reason": NODE_LOST_SKIPPED}]
        assert isinstance(LiveRun(app, load_trace("two-faults"), pin=None,
                                  timeout_s=1).faults, LocalFaults)
    finally:
        app.compute.kill_all()
        app.close()


def test_the_skip_is_printed_and_in_the_json() -> None:
    from shared.resilience.score import RunScore

    run = RunScore("chosen", "slurm", "bench-train", (),
                   skipped=({"index": 3, "kind": "node_lost", "reason": "why"},))
    assert run.as_dict()["skipped"] == [{"index": 3, "kind": "node_lost", "reason": "why"}]
    console = Console(record=True, width=200)
    print_table(console, load_trace("two-faults"), [run])
    assert "slurm/chosen: fault 3 (node_lost) skipped: why" in console.export_text()


def test_target_slurm_refuses_clearly_unless_root(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    state = tmp_path / "state"
    with pytest.raises(ValidationError, match="root"):
        from services.cli.bench_recovery import play

        play(load_trace("two-faults"), target="slurm", compare="requeue",
             state_root=state, timeout_s=1, say=lambda _m: None)
    assert not state.exists()  # nothing started, nothing written
    assert main(["--state-dir", str(state), "bench", "recovery", "--target", "slurm"]) != 0
