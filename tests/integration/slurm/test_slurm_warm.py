"""Warm processes on the real Slurm cluster: a torch (gloo, CPU) job of three ranks on n2-n4,
``examples/torch_inprocess.py``. One rank's program is SIGKILLed; the two others are held,
not killed, and the in-place attempt that follows is one more step in the same Slurm job,
in which they go on in their own processes (same pids) while the dead rank starts anew;
both attempts are recorded, and the job ends with success.

Own SlurmCompute (own state dir, partition ``mtcpools`` over n2-n4, ``warm=True``)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.compute.protocol import progress_path
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.adapters.compute.slurm.warm import control_path
from shared.domain.events import JobWorkersExited
from shared.ports import Gang, LaunchGroup, RecoveryPlan
from tests.harness import Recorder

from .conftest import Cluster, wait_for
from .test_slurm_ownership import until
from .test_slurm_pools import NODES, resumed
from .test_slurm_torch import in_service

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
JOB = "warm-ddp"


@pytest.fixture
def warm(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[SlurmCompute, Recorder]]:
    rec = Recorder()
    made = SlurmCompute(tmp_path / "state", rec, SystemClock(), slurm_conf=cluster.slurm_conf,
                        partition="mtcpools", slurm_nodes=NODES, agent_probes=("xid",),
                        observe_interval_s=0.0, warm=True)
    yield made, rec
    made.kill_all()
    made.close()
    wait_for(lambda: resumed(cluster), 60, "n2-n4 back in service", interval_s=0.5)


def declared_pid(run_dir: Path, rank: int) -> int | None:
    """The pid the rank's program declared in its control file's answers."""
    try:
        pid = json.loads(Path(f"{control_path(run_dir, rank)}.state").read_text()).get("pid")
    except (OSError, ValueError):
        return None
    return pid if isinstance(pid, int) else None


def step(checkpoint_dir: Path, rank: int) -> int:
    try:
        return int(json.loads(progress_path(checkpoint_dir, rank).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def test_a_crashed_rank_restarts_in_place_and_the_survivors_go_on_in_their_processes(
    warm: tuple[SlurmCompute, Recorder], cluster: Cluster, tmp_path: Path
) -> None:
    slurm_compute, rec = warm
    mapping = in_service(slurm_compute, rec, cluster, "w0", "w1", "w2")
    program = (sys.executable, str(ROOT / "examples" / "torch_inprocess.py"), "--steps", "120",
               "--step-time", "0.05", "--memory-every", "5")
    env = (("MTC_PROGRESS_INTERVAL_S", "0.1"),)
    out = tmp_path / "out"
    nodes = tuple(sorted(mapping))

    def gang(attempt: int, plan: RecoveryPlan | None) -> Gang:
        return Gang(JOB, attempt, nodes, (LaunchGroup(0, 3, program, env),), str(out / "c"),
                    str(out / "m"), str(out / "t"), recovery=plan)

    def log() -> str:
        path = slurm_compute.job_log(JOB)
        return path.read_text() if path.exists() else ""

    slurm_compute.start_workers(gang(1, None))
    first = slurm_compute.run_dir(JOB, 1)
    until(slurm_compute, lambda: all(declared_pid(first, r) for r in range(3))
          and step(out / "c", 0) >= 15, 240, "attempt 1 training, every rank declared")
    pids = {r: declared_pid(first, r) for r in range(3)}
    os.kill(pids[2] or 0, signal.SIGKILL)  # rank 2's program: its launcher records the exit
    until(slurm_compute, lambda: bool(rec.of(JobWorkersExited)), 60, "attempt 1 over")
    [ended] = rec.of(JobWorkersExited)
    assert ended.attempt == 1 and ended.exit_code not in (0, 75), (ended, log()[-3000:])
    assert "rank 2" in ended.detail or "rank-2" in ended.detail, ended.detail

    slurm_compute.start_workers(gang(2, RecoveryPlan("in_place")))
    until(slurm_compute, lambda: len(rec.of(JobWorkersExited)) >= 2, 240, "attempt 2 over")
    done = rec.of(JobWorkersExited)[-1]
    assert done.attempt == 2 and done.exit_code == 0, (done, log()[-4000:])
    # one allocation for both attempts, and the survivors' processes went on in it
    assert slurm_compute.slurm_job_id(JOB, 2) == slurm_compute.slurm_job_id(JOB, 1)
    second = slurm_compute.run_dir(JOB, 2)
    assert {r for r in range(3) if (second / f"rank-{r}.take").exists()} == {0, 1}
    text = log()
    for r in (0, 1):
        assert f"[mtc] rank {r}: went on in its process (pid {pids[r]})" in text, text[-4000:]
        assert f"rank {r}/3 pid {pids[r]}] call 1:" in text, text[-4000:]
    assert declared_pid(second, 2) not in (None, pids[2])  # rank 2: a new process
    assert "done at step 120" in text, text[-4000:]
    assert [e.attempt for e in rec.of(JobWorkersExited)] == [1, 2]


def test_a_signalled_gang_is_held_and_every_rank_goes_on_in_its_process(
    warm: tuple[SlurmCompute, Recorder], cluster: Cluster, tmp_path: Path
) -> None:
    """The control plane stops the gang (an XID on a node: ``signal_workers``): every rank
    declared, so each is held instead of signalled, the attempt ends 75, and the in-place
    attempt runs all three ranks in their processes (no new one)."""
    slurm_compute, rec = warm
    mapping = in_service(slurm_compute, rec, cluster, "s0", "s1", "s2")
    program = (sys.executable, str(ROOT / "examples" / "torch_inprocess.py"), "--steps", "60",
               "--step-time", "0.05", "--memory-every", "5")
    out = tmp_path / "out"
    nodes = tuple(sorted(mapping))

    def gang(attempt: int, plan: RecoveryPlan | None) -> Gang:
        return Gang("warm-held", attempt, nodes,
                    (LaunchGroup(0, 3, program, (("MTC_PROGRESS_INTERVAL_S", "0.1"),)),),
                    str(out / "c"), str(out / "m"), str(out / "t"), recovery=plan)

    slurm_compute.start_workers(gang(1, None))
    first = slurm_compute.run_dir("warm-held", 1)
    until(slurm_compute, lambda: all(declared_pid(first, r) for r in range(3))
          and step(out / "c", 0) >= 10, 240, "attempt 1 training, every rank declared")
    pids = {r: declared_pid(first, r) for r in range(3)}
    slurm_compute.signal_workers("warm-held", 1, grace_s=30)
    until(slurm_compute, lambda: bool(rec.of(JobWorkersExited)), 60, "attempt 1 held")
    [held] = rec.of(JobWorkersExited)
    assert held.exit_code == 75, held
    slurm_compute.start_workers(gang(2, RecoveryPlan("in_place")))
    until(slurm_compute, lambda: len(rec.of(JobWorkersExited)) >= 2, 240, "attempt 2 over")
    done = rec.of(JobWorkersExited)[-1]
    text = slurm_compute.job_log("warm-held").read_text()
    assert done.attempt == 2 and done.exit_code == 0, (done, text[-4000:])
    for r in range(3):
        assert f"[mtc] rank {r}: went on in its process (pid {pids[r]})" in text, text[-4000:]
    assert slurm_compute.slurm_job_id("warm-held", 2) == slurm_compute.slurm_job_id("warm-held", 1)
