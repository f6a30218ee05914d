"""The world a plain program sees is Vertex's: its program runs once per replica, whatever
the image and the machine's GPUs, so ``RANK`` and ``WORLD_SIZE`` count replicas. Proved at
the spec and environment level: the gang a job starts, what each node then runs (``pyenv``'s
argv), and the managed environment each replica gets."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shared.adapters.compute.protocol import managed_env
from shared.config import ControlPlaneConfig
from shared.domain.model import Job, JobState
from shared.domain.ranks import as_ranks
from shared.domain.specs import CustomJobSpec
from shared.launch import PYENV, TORCH_NODE, pyenv
from shared.service_layer.gangs import gang

TORCH_GPU = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"
A3 = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
      "acceleratorCount": 8}
# a plain torch.distributed program: it imports nothing of mtc and reads torch's variables
PROGRAM = ["python", "-c", "import os, torch.distributed as d; d.init_process_group('gloo'); "
                           "print(os.environ['RANK'], os.environ['WORLD_SIZE'])"]


def job(env: dict[str, str] | None = None) -> Job:
    pairs = [{"name": k, "value": v} for k, v in (env or {}).items()]
    pool: dict[str, Any] = {"machineSpec": A3, "replicaCount": 1, "containerSpec": {
        "imageUri": TORCH_GPU, "command": PROGRAM, "env": pairs}}
    spec = CustomJobSpec.parse({"displayName": "plain", "jobSpec": {
        "workerPoolSpecs": [pool, pool]}})
    return Job("plain-1", "c1", spec, JobState.RUNNING, 0.0, 0.0, attempt=1,
               node_ids=as_ranks(("gpu-000", "gpu-001")))


def node_argv(command: tuple[str, ...]) -> list[str]:
    """What ``pyenv`` on the node runs for the gang's command (the runtime at /rt)."""
    assert command[1] == str(PYENV), command
    split = command.index("--")
    opts = command[:split]
    nproc = int(opts[opts.index("--nproc-per-node") + 1])
    return pyenv.program_argv(Path("/rt"), command[split + 1:], nproc)


def deps(tmp_path: Path) -> Any:
    return SimpleNamespace(config=ControlPlaneConfig(output_root=tmp_path / "jobs", python="py"))


def test_two_pools_of_one_8_gpu_replica_are_a_world_of_two(tmp_path: Path) -> None:
    g = gang(job(), deps(tmp_path))
    assert [(x.first_rank, x.count) for x in g.groups] == [(0, 1), (1, 1)]
    for group in g.groups:  # the program itself, once per replica: no torchrun around it
        assert node_argv(group.command) == PROGRAM
    envs = [managed_env(w, "10.0.0.1", pools=(1, 1)) for w in g.workers()]
    assert [(e["RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "2"), ("1", "2")]
    assert {(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in envs} == {("0", "1")}
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
    cluster = [json.loads(e["CLUSTER_SPEC"]) for e in envs]
    assert [len(c["cluster"][p]) for c in cluster[:1] for p in ("workerpool0", "workerpool1")] \
        == [1, 1]
    assert [(c["task"]["type"], c["task"]["index"]) for c in cluster] == [
        ("workerpool0", 0), ("workerpool1", 0)]
    tf = [json.loads(e["TF_CONFIG"])["task"]["type"] for e in envs]
    assert tf == ["chief", "worker"]


@pytest.mark.parametrize(("asked", "nproc"), [("8", 8), ("gpu", 8)])
def test_several_processes_per_replica_only_when_the_job_asks(tmp_path: Path, asked: str,
                                                              nproc: int) -> None:
    g = gang(job({"MTC_PROCESSES_PER_NODE": asked}), deps(tmp_path))
    for group in g.groups:  # torchrun on each node: WORLD_SIZE 2 x nproc, as the job asked
        assert node_argv(group.command) == [
            str(Path("/rt") / "bin" / "python"), str(TORCH_NODE), "--nproc-per-node",
            str(nproc), "--", *PROGRAM]
