"""A PyTorch job on the real Slurm cluster: 2 nodes x 2 processes of examples/torch_ddp.py,
``srun`` + ``worker_launcher`` + ``torch.distributed.run`` per node (``shared/launch/torch_node``),
gloo on CPU: the 4 ranks form one process group and run to success (task.sh's per-task
``GROUP_RANK``, ``NODE_RANK`` and ``TF_CONFIG`` are checked in test_slurm_scripts).

Own SlurmCompute (own state dir, partition ``mtcpools`` over n2-n4)."""

from __future__ import annotations

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


def test_torch_ddp_on_two_slurm_nodes_with_two_processes_each(
    compute: tuple[SlurmCompute, Recorder], cluster: Cluster, tmp_path: Path  # noqa: F811
) -> None:
    slurm_compute, rec = compute
    mapping = provision(slurm_compute, rec, "t0", "t1")
    for node_id in mapping:
        slurm_compute.uncordon(node_id)
    until(slurm_compute, lambda: all(cluster.slurm.node(n).available
                                     and not cluster.slurm.node(n).drained
                                     for n in mapping.values()), 30, "nodes in service")
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
