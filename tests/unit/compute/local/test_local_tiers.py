"""The local adapter's checkpoint tiers with examples/train.py: each rank's memory on its
own simulated node, its peer copy on its buddy's; a lost node takes both what it held, and
its rank restores from the copy on the buddy's node, bit for bit."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from local_compute_support import FakeClock, poll_until

from mtc_program import entries
from shared.adapters.compute.local.compute import LocalCompute
from shared.domain.events import JobCheckpointSaved, JobWorkersExited
from shared.domain.health import RepairAction
from tests.harness import Recorder, one_pool_gang

TRAIN = Path(__file__).resolve().parents[4] / "examples" / "train.py"
pytestmark = pytest.mark.slow  # real worker subprocesses
TIERS = (("MTC_TIER1_EVERY", "4"), ("MTC_PROGRESS_INTERVAL_S", "0.1"))


def newest(directory: Path) -> int:
    found = entries.list_entries(directory, "memory")
    return found[0].step if found else 0


def model(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_a_lost_nodes_rank_restores_from_its_buddys_copy(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, clock: FakeClock,
    tmp_path: Path,
) -> None:
    compute = make_compute()
    out = tmp_path / "out"
    slow = (sys.executable, str(TRAIN), "--steps", "24", "--checkpoint-every", "0",
            "--step-time", "0.05")
    compute.start_workers(one_pool_gang("job-1", 1, ["n0", "n1"], slow, TIERS, out=out))
    mem, job = compute.memory_root, "job-1"
    held = {  # what each node holds: its rank's memory, the peer copy of the other rank
        "n0": (mem("n0") / job / "rank-0", mem("n0") / job / "peer" / "rank-1"),
        "n1": (mem("n1") / job / "rank-1", mem("n1") / job / "peer" / "rank-0"),
    }

    def saved_twice() -> bool:
        clock.advance(5.0)  # the adapter reads the heartbeats at a bounded rate
        return all(newest(d) >= 8 for dirs in held.values() for d in dirs)

    poll_until(compute, saved_twice, timeout_s=30)
    poll_until(compute, lambda: {e.tier for e in recorder.of(JobCheckpointSaved)} >= {"memory", "peer"},
               timeout_s=10)
    compute.stop_workers(job, 1)
    poll_until(compute, lambda: bool(recorder.of(JobWorkersExited)))
    assert not any((out / "checkpoints").glob("ckpt-*"))  # nothing durable: the tiers only

    compute.start_repair("n0", RepairAction.REPLACE, 1)  # the node goes, with its memory
    assert not mem("n0").exists() and all(d.exists() for d in held["n1"])
    fast = (sys.executable, str(TRAIN), "--steps", "24", "--checkpoint-every", "0")
    compute.start_workers(one_pool_gang(job, 2, ["n2", "n1"], fast, TIERS, out=out))  # a spare
    poll_until(compute, lambda: len(recorder.of(JobWorkersExited)) == 2, timeout_s=30)
    assert recorder.of(JobWorkersExited)[-1].exit_code == 0
    logs = [compute.log_path(job, 2, r).read_text() for r in (0, 1)]
    got = [re.search(r"restoring step (\d+) from the (\w+) tier", log) for log in logs]
    assert got[0] and got[1], logs
    assert (got[0][2], got[1][2]) == ("peer", "memory")  # rank 0's node is new; rank 1's kept
    assert got[0][1] == got[1][1] and int(got[0][1]) >= 4  # one step, agreed by both ranks

    reference = tmp_path / "reference"
    done = subprocess.run([sys.executable, str(TRAIN), "--steps", "24"], capture_output=True,
                          env={"PATH": "/usr/bin:/bin", "AIP_CHECKPOINT_DIR": str(reference / "c"),
                               "AIP_MODEL_DIR": str(reference / "m")}, timeout=60)
    assert done.returncode == 0, done.stderr
    want, have = model(reference / "m" / "model.npz"), model(out / "model" / "model.npz")
    assert want.keys() == have.keys() and all(want[k].tobytes() == have[k].tobytes() for k in want)
