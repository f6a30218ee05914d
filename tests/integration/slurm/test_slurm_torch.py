"""A PyTorch job on the real Slurm cluster: 2 nodes x 2 processes of examples/torch_ddp.py,
``srun`` + ``worker_launcher`` + ``torch.distributed.run`` per node (``shared/launch/torch_node``),
gloo on CPU: the 4 ranks form one process group and run to success (task.sh's per-task
``GROUP_RANK``, ``NODE_RANK`` and ``TF_CONFIG`` are checked in test_slurm_scripts).

Own SlurmCompute (own state dir, partition ``mtcpools`` over n2-n4)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import JobWorkersExited
from shared.launch import TORCH_NODE
from shared.ports import Gang, LaunchGroup
from tests.harness import Recorder

from .conftest import Cluster
from .test_slurm_ownership import provision, until
from .test_slurm_pools import compute  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
STEPS = "2001"  # an odd count: finds this test's ranks among the processes


def in_service(slurm: SlurmCompute, rec: Recorder, cluster: Cluster, *ids: str
               ) -> dict[str, str]:
    """Provision ``ids``, put them in service and wait until Slurm has them available."""
    mapping = provision(slurm, rec, *ids)
    for node_id in mapping:
        slurm.uncordon(node_id)
    until(slurm, lambda: all(cluster.slurm.node(n).available
                               and not cluster.slurm.node(n).drained
                               for n in mapping.values()), 30, "nodes in service")
    return mapping


def ranks() -> list[int]:
    """The pids of the program's ranks (torch.distributed.run's children), not the launchers'
    (whose command lines hold the program's too)."""
    found = subprocess.run(["pgrep", "-af", f"examples/torch_ddp.py --steps {STEPS}"],
                           capture_output=True, text=True, check=False).stdout.splitlines()
    return [int(line.split()[0]) for line in found
            if "torch_node" not in line and "launcher" not in line]


def test_torch_ddp_on_two_slurm_nodes_with_two_processes_each(
    compute: tuple[SlurmCompute, Recorder], cluster: Cluster, tmp_path: Path  # noqa: F811
) -> None:
    slurm_compute, rec = compute
    mapping = in_service(slurm_compute, rec, cluster, "t0", "t1")
    program = (sys.executable, str(TORCH_NODE), "--nproc-per-node", "2", "--",
               sys.executable, str(ROOT / "examples" / "torch_ddp.py"), "--steps", "8")
    out = tmp_path / "out"
    groups = (LaunchGroup(0, 1, program, ()), LaunchGroup(1, 1, program, ()))
    slurm_compute.start_workers(Gang("ddp", 1, tuple(sorted(mapping)), groups,
                                     str(out / "c"), str(out / "m"), str(out / "t")))
    until(slurm_compute, lambda: bool(rec.of(JobWorkersExited)), 240, "attempt over")
    [ended] = rec.of(JobWorkersExited)
    log = slurm_compute.job_log("ddp").read_text()
    assert ended.exit_code == 0, (ended, log[-3000:])
    assert all(f"rank {r}: done at step 8" in log for r in range(4)), log[-3000:]
    assert (out / "m" / "model.pt").is_file()


def test_torch_gang_on_slurm_stops_on_sigterm_resumes_and_ends_when_a_rank_is_killed(
    compute: tuple[SlurmCompute, Recorder], cluster: Cluster, tmp_path: Path  # noqa: F811
) -> None:
    """As the numpy job does on Slurm: SIGTERM to the gang => every rank checkpoints and exits
    75; the next attempt resumes from that step; SIGKILL of one rank's process ends the whole
    gang (srun --kill-on-bad-exit) with a failure code, the others not left waiting."""
    slurm_compute, rec = compute
    mapping = in_service(slurm_compute, rec, cluster, "k0", "k1")
    program = (sys.executable, str(TORCH_NODE), "--nproc-per-node", "2", "--",
               sys.executable, str(ROOT / "examples" / "torch_ddp.py"), "--steps", STEPS,
               "--step-time", "0.05", "--checkpoint-every", "0")
    out = tmp_path / "out"
    groups = (LaunchGroup(0, 1, program, ()), LaunchGroup(1, 1, program, ()))

    def start(attempt: int) -> None:
        slurm_compute.start_workers(Gang("ddp-heal", attempt, tuple(sorted(mapping)), groups,
                                         str(out / "c"), str(out / "m"), str(out / "t")))

    def log() -> str:
        path = slurm_compute.job_log("ddp-heal")
        return path.read_text() if path.exists() else ""

    start(1)
    until(slurm_compute, lambda: "step 20 loss" in log(), 240, "attempt 1 training")
    slurm_compute.signal_workers("ddp-heal", 1, grace_s=60)
    until(slurm_compute, lambda: bool(rec.of(JobWorkersExited)), 120, "attempt 1 over")
    [first] = rec.of(JobWorkersExited)
    assert first.exit_code == 75, (first, log()[-3000:])
    stopped = sorted({int(m) for m in re.findall(r"stopped at step (\d+), checkpoint saved",
                                                 log())})
    assert len(stopped) == 1, log()[-3000:]  # the four ranks agreed on one step
    assert (out / "c" / f"ckpt-{stopped[0]:08d}.pt").is_file()

    start(2)
    until(slurm_compute, lambda: f"rank 0: resumed from step {stopped[0]}" in log()
          and f"step {stopped[0] + 10} loss" in log(), 240, "attempt 2 resumed")
    victims = ranks()
    assert len(victims) == 4, victims  # the four ranks of attempt 2
    os.kill(victims[-1], signal.SIGKILL)
    until(slurm_compute, lambda: len(rec.of(JobWorkersExited)) >= 2, 120, "attempt 2 over")
    ended = rec.of(JobWorkersExited)[-1]
    assert ended.attempt == 2 and ended.exit_code not in (0, 75), (ended, log()[-3000:])
    until(slurm_compute, lambda: not ranks(), 60, "no rank left running")
