"""PyTorch jobs' pure parts: the prebuilt-image table, processes per replica, the commands a
pool's replicas run, torchrun's environment and TF_CONFIG, and torch_node's exit code."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shared.adapters.compute.protocol import managed_env
from shared.config import ControlPlaneConfig
from shared.domain import images
from shared.domain.errors import ValidationError
from shared.domain.specs import WorkerPoolSpec
from shared.launch import PYENV, TORCH_NODE, pyenv
from shared.launch.torch_node import node_code
from shared.ports import WorkerSpec
from shared.service_layer.pool_commands import pool_command

TORCH_GPU = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"
TORCH_CPU = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-1.py310:latest"


def test_prebuilt_images_map_to_the_pytorch_runtime_and_others_are_custom() -> None:
    runtime, version = images.prebuilt(TORCH_GPU) or (None, "")
    assert runtime is not None and runtime.framework == "torch" and version == "2.4"
    assert images.prebuilt("asia-docker.pkg.dev/vertex-ai/training/pytorch-xla.2-4.py310")
    assert images.prebuilt("gcr.io/me/trainer:1") is None  # a custom image
    with pytest.raises(ValueError, match="pytorch-cpu"):
        images.prebuilt("us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-15.py310:latest")


def pool(image: str, *, accelerators: int = 8, env: dict[str, str] | None = None,
         package: bool = False) -> WorkerPoolSpec:
    machine: dict[str, Any] = {"machineType": "a3-highgpu-8g"}
    if accelerators:
        machine.update(acceleratorType="NVIDIA_H100_80GB", acceleratorCount=accelerators)
    pairs = [{"name": k, "value": v} for k, v in (env or {}).items()]
    spec: dict[str, Any] = {"machineSpec": machine, "replicaCount": 1}
    if package:
        spec["pythonPackageSpec"] = {"executorImageUri": image, "pythonModule": "trainer.task",
                                     "packageUris": ["gs://b/p/trainer-0.1.tar.gz"],
                                     "args": ["--steps", "3"], "env": pairs}
    else:
        spec["containerSpec"] = {"imageUri": image, "command": ["python", "train.py"],
                                 "env": pairs}
    return WorkerPoolSpec.parse(spec, "jobSpec.workerPoolSpecs[0]")


@pytest.mark.parametrize(("image", "env", "expected"), [
    (TORCH_GPU, {}, 1),  # once per replica whatever the image, as Vertex runs it
    (TORCH_CPU, {}, 1),
    ("local", {}, 1),
    ("local", {"MTC_PROCESSES_PER_NODE": "2"}, 2),
    (TORCH_GPU, {"MTC_PROCESSES_PER_NODE": "3"}, 3),
    (TORCH_GPU, {"MTC_PROCESSES_PER_NODE": "gpu"}, 8),  # as torchrun --nproc-per-node=gpu
    ("local", {"MTC_PROCESSES_PER_NODE": "gpu"}, 8),
])
def test_processes_per_replica(image: str, env: dict[str, str], expected: int) -> None:
    assert pool(image, env=env).processes_per_replica() == expected


@pytest.mark.parametrize(("asked", "accelerators"), [("0", 8), ("65", 8), ("gpus", 8), ("gpu", 0)])
def test_a_bad_process_count_is_refused_naming_the_field(asked: str, accelerators: int) -> None:
    with pytest.raises(ValidationError) as err:
        pool("local", accelerators=accelerators, env={"MTC_PROCESSES_PER_NODE": asked})
    assert err.value.path == "jobSpec.workerPoolSpecs[0].containerSpec.env.MTC_PROCESSES_PER_NODE"


def deps(tmp_path: Path) -> Any:
    return SimpleNamespace(config=ControlPlaneConfig(output_root=tmp_path / "jobs", python="py"))


def test_commands_a_pool_runs(tmp_path: Path) -> None:
    d = deps(tmp_path)
    assert pool_command(pool("local"), d)[0] == ("python", "train.py")  # today's meaning
    several = pool_command(pool("local", env={"MTC_PROCESSES_PER_NODE": "2"}), d)[0]
    assert several == ("py", str(TORCH_NODE), "--nproc-per-node", "2", "--", "python", "train.py")
    wheel = str(tmp_path / "jobs" / "gcs" / "b" / "p" / "trainer-0.1.tar.gz")  # gs:// stand-in
    for asked, nproc in (({}, "1"), ({"MTC_PROCESSES_PER_NODE": "gpu"}, "2")):
        command, env = pool_command(pool(TORCH_GPU, accelerators=2, env=asked, package=True), d)
        assert command == ("py", str(PYENV), "--cache", str(tmp_path / "runtimes"),
                           "--runtime", "pytorch", "--framework", "torch", "--nproc-per-node",
                           nproc, "--package", wheel, "--", "-m", "trainer.task", "--steps", "3")
        assert env == tuple(asked.items())


def test_torchrun_environment_and_tf_config() -> None:
    spec = WorkerSpec("j", 1, 2, 3, "n2", ("x",), (("RANK", "9"),), "/o/checkpoints", "/o/model",
                      "/o/logs")
    env = managed_env(spec, "10.0.0.1", pools=(1, 2))
    assert env["RANK"] == env["GROUP_RANK"] == env["NODE_RANK"] == "2"  # not the spec's own
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["WORLD_SIZE"]) == ("0", "1", "3")
    tf = json.loads(env["TF_CONFIG"])
    cluster = json.loads(env["CLUSTER_SPEC"])["cluster"]
    assert tf["cluster"] == {"chief": cluster["workerpool0"], "worker": cluster["workerpool1"]}
    assert tf["task"]["type"] == "worker" and tf["task"]["index"] == 1


@pytest.mark.parametrize(("codes", "torchrun", "expected"), [
    ([(1.0, 0), (2.0, 0)], 0, 0),
    ([(1.0, 75), (2.0, 75)], 1, 75),  # checkpointed on SIGTERM: torchrun's 1 says nothing
    ([(2.0, 75), (1.0, 137)], 1, 137),  # a killed process ended the node
    ([(2.0, 1), (1.0, 137)], 1, 137),  # the earliest failure, not the consequence
    ([(1.0, 0)], 143, 143),  # a process left no code: torchrun's
])
def test_torch_node_exit_code(codes: list[tuple[float, int]], torchrun: int,
                              expected: int) -> None:
    assert node_code(codes, torchrun, 2) == expected


def test_a_package_pip_cannot_install_fails_with_pips_last_lines(tmp_path: Path) -> None:
    wheel = tmp_path / "bad-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("bad/__init__.py", "")
        z.writestr("bad-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: bad\n"
                   "Version: 0.1\nRequires-Dist: no-such-dependency-here\n")
        z.writestr("bad-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("bad-0.1.dist-info/RECORD", "")
    rt = pyenv.runtime(tmp_path / "cache", "plain", "json")  # (json: a quick import)
    with pytest.raises(pyenv.SetupFailed, match="no-such-dependency-here"):
        pyenv.package_env(tmp_path / "cache", rt, "plain", [wheel])
    assert not list((tmp_path / "cache").glob("env-*"))  # nothing half-built is kept
