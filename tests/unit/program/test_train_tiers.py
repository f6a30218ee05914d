"""examples/train.py on the checkpoint tiers, as a real subprocess: killed (SIGKILL, no
save on the way out) after a tier-1 save, resumed from memory, from the peer copy (its
memory gone) and from durable storage (both gone), each ending bit for bit where an
uninterrupted run ends."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mtc_program import entries

TRAIN = Path(__file__).resolve().parents[3] / "examples" / "train.py"
STEPS = "40"


def env_for(root: Path, tiers: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MTC_", "AIP_", "CLUSTER_SPEC", "RANK", "WORLD_SIZE"))}
    env.update(CLOUD_ML_JOB_ID="job-t", AIP_CHECKPOINT_DIR=str(root / "checkpoints"),
               AIP_MODEL_DIR=str(root / "model"))
    if tiers:
        env.update(MTC_TIER1_DIR=str(root / "node-a" / "job-t" / "rank-0"),
                   MTC_TIER2_DIR=str(root / "node-b" / "job-t" / "peer" / "rank-0"),
                   MTC_TIER1_EVERY="4", MTC_PROGRESS_FILE=str(root / "progress" / "rank-0.json"))
    return env


def model(root: Path) -> dict[str, np.ndarray]:
    with np.load(root / "model" / "model.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The uninterrupted run, durable only (as before the tiers)."""
    root = tmp_path_factory.mktemp("reference")
    done = subprocess.run([sys.executable, str(TRAIN), "--steps", STEPS], env=env_for(root, False),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return model(root)


def killed_after_tier1(root: Path, *, at_least: int, durable_every: str = "0") -> int:
    """Run until tier 1 holds an entry of ``at_least`` or later (and, with durable saves, a
    durable checkpoint exists), then SIGKILL: no save on the way out. Returns the newest
    tier-1 step."""
    proc = subprocess.Popen([sys.executable, str(TRAIN), "--steps", STEPS, "--step-time", "0.03",
                             "--checkpoint-every", durable_every],
                            env=env_for(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tier1 = root / "node-a" / "job-t" / "rank-0"
    deadline = time.monotonic() + 30
    try:
        while True:
            done = entries.list_entries(tier1, "memory")
            durable = durable_every == "0" or any((root / "checkpoints").glob("ckpt-*.npz"))
            if done and done[0].step >= at_least and durable:
                break
            assert proc.poll() is None, "finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    return entries.list_entries(tier1, "memory")[0].step


def resume(root: Path) -> str:
    done = subprocess.run([sys.executable, str(TRAIN), "--steps", STEPS], env=env_for(root),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def assert_bitwise(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys() == {"w1", "b1", "w2", "b2", "step"}
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.slow
def test_resumed_from_memory_is_bit_exact(tmp_path: Path, reference: dict[str, np.ndarray]) -> None:
    step = killed_after_tier1(tmp_path, at_least=8)
    assert not any((tmp_path / "checkpoints").glob("ckpt-*"))  # nothing durable to fall back on
    out = resume(tmp_path)
    assert f"restoring step {step} from the memory tier" in out
    assert_bitwise(model(tmp_path), reference)


@pytest.mark.slow
def test_resumed_from_the_peer_copy_is_bit_exact(tmp_path: Path,
                                                 reference: dict[str, np.ndarray]) -> None:
    step = killed_after_tier1(tmp_path, at_least=8)
    shutil.rmtree(tmp_path / "node-a")  # the rank's node lost its memory
    out = resume(tmp_path)
    restored = re.search(r"restoring step (\d+) from the peer tier", out)
    assert restored, out
    assert step - 4 <= int(restored[1]) <= step  # the copy lags memory by one save at most
    assert_bitwise(model(tmp_path), reference)


@pytest.mark.slow
def test_resumed_from_durable_is_bit_exact(tmp_path: Path, reference: dict[str, np.ndarray]) -> None:
    killed_after_tier1(tmp_path, at_least=12, durable_every="10")
    shutil.rmtree(tmp_path / "node-a")
    shutil.rmtree(tmp_path / "node-b")
    out = resume(tmp_path)
    assert "restoring step 10 from the durable tier" in out
    assert_bitwise(model(tmp_path), reference)
