"""examples/train.py as a real subprocess: checkpoints, preemption, bitwise-exact resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TRAIN = Path(__file__).resolve().parents[3] / "examples" / "train.py"
PARAMS = ("w1", "b1", "w2", "b2")
MANAGED = (
    "CLOUD_ML_JOB_ID", "CLUSTER_SPEC", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "AIP_CHECKPOINT_DIR", "AIP_MODEL_DIR", "AIP_TENSORBOARD_LOG_DIR",
)  # fmt: skip


def job_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in MANAGED}
    env.update(
        CLOUD_ML_JOB_ID="job-t",
        AIP_CHECKPOINT_DIR=str(root / "checkpoints"),
        AIP_MODEL_DIR=str(root / "model"),
        AIP_TENSORBOARD_LOG_DIR=str(root / "tb"),
    )
    env.update(extra)
    return env


def train(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TRAIN), *args],
        env=job_env(root, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def model(root: Path) -> dict[str, np.ndarray]:
    with np.load(root / "model" / "model.npz") as z:
        return {k: z[k] for k in z.files}


def checkpoints(root: Path) -> list[Path]:
    return sorted((root / "checkpoints").glob("ckpt-*.npz"))


def assert_bitwise_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys() == {*PARAMS, "step"}
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
        assert a[k].tobytes() == b[k].tobytes()


def preempt(root: Path, *args: str) -> str:
    """Start a run, SIGTERM it once a new checkpoint exists, return its output."""
    before = len(checkpoints(root))
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN), *args],
        env=job_env(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while len(checkpoints(root)) <= before:
        assert proc.poll() is None, "finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75, out
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The uninterrupted 60-step run."""
    root = tmp_path_factory.mktemp("reference")
    done = train(root, "--steps", "60", "--checkpoint-every", "10")
    assert done.returncode == 0, done.stderr
    assert "no checkpoint found: starting from step 0" in done.stdout
    assert [p.name for p in checkpoints(root)] == [f"ckpt-{s:08d}.npz" for s in range(10, 70, 10)]
    assert (root / "checkpoints" / "LATEST").read_text() == "ckpt-00000060.npz\n"
    return model(root)


@pytest.mark.slow
def test_interrupted_and_resumed_run_ends_with_bitwise_identical_weights(
    tmp_path: Path, reference: dict[str, np.ndarray]
) -> None:
    slow = ("--steps", "60", "--checkpoint-every", "7", "--step-time", "0.01")
    resumed_from = []
    for _ in range(2):  # preempted twice, at whatever step the signal lands on
        out = preempt(tmp_path, *slow)
        assert "SIGTERM received: preempted at step" in out
        step = int(re.findall(r"preempted at step (\d+)", out)[0])
        assert checkpoints(tmp_path)[-1].name == f"ckpt-{step:08d}.npz"  # saved on the way out
        resumed_from.append(step)
    assert not (tmp_path / "model" / "model.npz").exists()
    done = train(tmp_path, "--steps", "60", "--checkpoint-every", "7")
    assert done.returncode == 0, done.stderr
    assert f"resumed from step {resumed_from[-1]}" in done.stdout
    assert 0 < resumed_from[0] < resumed_from[1] < 60
    assert_bitwise_equal(model(tmp_path), reference)


@pytest.mark.slow
def test_a_corrupt_newest_checkpoint_is_skipped(
    tmp_path: Path, reference: dict[str, np.ndarray]
) -> None:
    assert train(tmp_path, "--steps", "30", "--checkpoint-every", "10").returncode == 0
    ckpt = tmp_path / "checkpoints"
    good = (ckpt / "ckpt-00000030.npz").read_bytes()
    (ckpt / "ckpt-00000040.npz").write_bytes(good[: len(good) // 2])  # a torn write
    (ckpt / ".ckpt-00000050.npz.x1y2.tmp").write_bytes(good)  # a writer's temp file
    done = train(tmp_path, "--steps", "60", "--checkpoint-every", "10")
    assert done.returncode == 0, done.stderr
    assert "skipping checkpoint ckpt-00000040.npz" in done.stdout
    assert "resumed from step 30" in done.stdout
    assert_bitwise_equal(model(tmp_path), reference)


@pytest.mark.slow
def test_a_checkpoint_whose_content_disagrees_with_its_name_is_skipped(tmp_path: Path) -> None:
    assert train(tmp_path, "--steps", "20", "--checkpoint-every", "10").returncode == 0
    ckpt = tmp_path / "checkpoints"
    (ckpt / "ckpt-00000020.npz").rename(ckpt / "ckpt-00000025.npz")
    done = train(tmp_path, "--steps", "20")
    assert "skipping checkpoint ckpt-00000025.npz" in done.stdout
    assert "resumed from step 10" in done.stdout


@pytest.mark.slow
def test_a_finished_run_started_again_only_rewrites_the_model(
    tmp_path: Path, reference: dict[str, np.ndarray]
) -> None:
    assert train(tmp_path, "--steps", "60", "--checkpoint-every", "10").returncode == 0
    again = train(tmp_path, "--steps", "60", "--checkpoint-every", "10")
    assert again.returncode == 0 and "resumed from step 60" in again.stdout
    assert_bitwise_equal(model(tmp_path), reference)
    acc = EventAccumulator(str(tmp_path / "tb" / "attempt-1"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, 61))
    assert not list((tmp_path / "tb").glob("attempt-2/events.*"))  # nothing new to write


@pytest.mark.slow
def test_other_ranks_compute_the_same_weights_and_write_nothing(tmp_path: Path) -> None:
    args = ("--steps", "30", "--checkpoint-every", "10")
    chief = train(tmp_path / "r0", *args, RANK="0", WORLD_SIZE="2")
    other = train(tmp_path / "r1", *args, RANK="1", WORLD_SIZE="2")
    assert chief.returncode == other.returncode == 0
    digest = re.compile(r"weights sha256 ([0-9a-f]+)")
    assert digest.findall(chief.stdout) == digest.findall(other.stdout) != []
    assert "rank 1/2" in other.stdout
    assert not (tmp_path / "r1" / "checkpoints").exists()
    assert not (tmp_path / "r1" / "model").exists()


def test_reads_the_cluster_spec(tmp_path: Path) -> None:
    spec = json.dumps({"cluster": {"workerpool0": ["a:1", "b:1"]}, "task": {"index": 1}})
    done = train(tmp_path, "--steps", "2", CLUSTER_SPEC=spec, WORLD_SIZE="2", MASTER_PORT="29500")
    assert done.returncode == 0, done.stderr
    assert "rank 1/2" in done.stdout and "master=127.0.0.1:29500" in done.stdout
    pools = {"workerpool0": ["a:1"], "workerpool1": ["b:1", "c:1"]}  # a chief and two workers
    spec = json.dumps({"cluster": pools, "task": {"type": "workerpool1", "index": 1}})
    done = train(tmp_path / "w", "--steps", "2", CLUSTER_SPEC=spec, RANK="2", WORLD_SIZE="3")
    assert done.returncode == 0, done.stderr
    assert "rank 2/3" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WORLD_SIZE": "abc"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "-1"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be smaller than WORLD_SIZE=2"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
        ({"CLUSTER_SPEC": "{not json"}, "CLUSTER_SPEC"),
        ({"CLUSTER_SPEC": '{"task": {"index": "x"}}'}, "CLUSTER_SPEC task.index"),
        ({"CLUSTER_SPEC": '{"task": {"index": 0}}', "RANK": "1", "WORLD_SIZE": "2"}, "disagrees"),
    ],
)
def test_garbage_environment_is_a_clear_error(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    done = train(tmp_path, "--steps", "5", **env)
    assert done.returncode == 2
    assert "configuration error" in done.stderr and named in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "checkpoints").exists()


def test_a_preempted_non_chief_rank_exits_75_without_writing(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN), "--steps", "100000", "--step-time", "0.01"],
        env=job_env(tmp_path, RANK="1", WORLD_SIZE="2"),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    while "step 0" not in proc.stdout.readline():  # "starting from step 0": past start-up
        pass
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75 and "SIGTERM received" in out
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "model").exists()
