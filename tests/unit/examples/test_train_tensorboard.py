"""examples/train.py's TensorBoard scalars, read back with TensorBoard's own reader: one run
per attempt, and across a resume one curve, steps 1..N, without repeats or gaps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.unit.examples.test_train_example import TRAIN, checkpoints, job_env, preempt, train

SLOW = ("--steps", "60", "--checkpoint-every", "20", "--step-time", "0.01")


def scalars(run_dir: Path) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    if "loss" not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars("loss")]


def curve(root: Path) -> list[tuple[int, float]]:
    """Every attempt's points, attempts in order: what TensorBoard draws."""
    runs = sorted((root / "tb").glob("attempt-*"), key=lambda p: int(p.name.split("-")[1]))
    return [point for run in runs for point in scalars(run)]


def reference(root: Path) -> list[tuple[int, float]]:
    done = train(root, "--steps", "60", "--checkpoint-every", "20")
    assert done.returncode == 0, done.stderr
    return curve(root)


@pytest.mark.slow
def test_a_resume_after_sigterm_continues_the_curve(tmp_path: Path) -> None:
    out = preempt(tmp_path / "run", *SLOW)
    stopped = int(out.split("preempted at step ")[1].split(",")[0])
    first = scalars(tmp_path / "run" / "tb" / "attempt-1")
    assert [s for s, _ in first] == list(range(1, stopped + 1))  # all of it, on disk at exit
    done = train(tmp_path / "run", *SLOW)
    assert done.returncode == 0, done.stderr
    second = scalars(tmp_path / "run" / "tb" / "attempt-2")
    assert second and second[0][0] == stopped + 1  # the new attempt writes from N+1 on
    steps = [s for s, _ in curve(tmp_path / "run")]
    assert steps == list(range(1, 61))  # strictly increasing, no duplicates, no gap
    assert curve(tmp_path / "run") == reference(tmp_path / "ref")  # the same values, too


@pytest.mark.slow
def test_steps_recomputed_after_a_kill_are_not_written_twice(tmp_path: Path) -> None:
    """SIGKILL after the step-20 checkpoint and after some later steps reached the event
    files: the resumed attempt recomputes 21.. from the checkpoint but writes only what the
    first attempt's files lack."""
    root = tmp_path / "run"
    slower = ("--steps", "60", "--checkpoint-every", "20", "--step-time", "0.05")
    proc = subprocess.Popen([sys.executable, str(TRAIN), *slower], env=job_env(root),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    try:
        while not (checkpoints(root) and [s for s, _ in scalars(root / "tb" / "attempt-1")
                                          if s > 20]):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    written = max(s for s, _ in scalars(root / "tb" / "attempt-1"))
    latest = int(checkpoints(root)[-1].name[5:13])
    assert written > latest  # some steps will be recomputed
    done = train(root, "--steps", "60", "--checkpoint-every", "20", MTC_JOB_ATTEMPT="7")
    assert done.returncode == 0, done.stderr
    assert f"resumed from step {latest}" in done.stdout
    assert scalars(root / "tb" / "attempt-7")[0][0] == written + 1
    steps = [s for s, _ in curve(root)]
    assert steps == list(range(1, 61)), steps
    assert curve(root) == reference(tmp_path / "ref")


def test_without_tensorboardx_it_warns_and_trains_on(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "tensorboardX.py").write_text("raise ImportError('No module named tensorboardX')\n")
    env = job_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(fake), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(TRAIN), "--steps", "10"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "warning: no TensorBoard scalars" in done.stderr
    assert (tmp_path / "model" / "model.npz").exists()
    assert not list((tmp_path / "tb").rglob("events.*"))


def test_a_garbage_attempt_number_is_a_clear_error(tmp_path: Path) -> None:
    done = train(tmp_path, "--steps", "5", MTC_JOB_ATTEMPT="zero")
    assert done.returncode == 2 and "MTC_JOB_ATTEMPT" in done.stderr


@pytest.mark.slow
def test_the_chief_opens_its_scalars_without_importing_torch(tmp_path: Path) -> None:
    """tensorboardX imports torch when it is installed (seconds of the chief's start); the
    numpy program never needs it. Run in a fresh interpreter: the scalars open, write and
    read back, and torch is not in ``sys.modules`` afterwards."""
    pytest.importorskip("torch")
    code = (
        "import sys, importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('train', {str(TRAIN)!r})\n"
        "train = importlib.util.module_from_spec(spec); sys.modules['train'] = train\n"
        "spec.loader.exec_module(train)\n"
        f"s = train.Scalars(__import__('pathlib').Path({str(tmp_path / 'tb')!r}), 1, print)\n"
        "s.add(1, {'loss': 0.5}); s.close()\n"
        "print('torch imported' if 'torch' in sys.modules else 'no torch')\n"
        "import torch; print('torch still importable', torch.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    assert "no torch" in done.stdout
    assert "torch still importable torch" in done.stdout
    assert [step for step, _ in scalars(tmp_path / "tb" / "attempt-1")] == [1]
