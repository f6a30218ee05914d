"""Each rank gets a TMPDIR of its own, gone when its attempt ends: what torch and torchrun
write to the temp directory (compile caches, rendezvous files) never litters the node."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from local_compute_support import poll_until

from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.local.procs import rank_tmp
from shared.domain.events import JobWorkersExited
from tests.harness import Recorder, one_pool_gang

PY = sys.executable
pytestmark = pytest.mark.slow  # real worker subprocesses

WRITE = textwrap.dedent("""
    import json, os, tempfile
    where = tempfile.mkdtemp(prefix="torchinductor_")
    open(os.path.join(where, "cache"), "w").write("x")
    print(json.dumps({"tmpdir": os.environ.get("TMPDIR"), "made": where}), flush=True)
""")


def exited(recorder: Recorder) -> bool:
    return any(isinstance(e, JobWorkersExited) for e in recorder.events)


def test_each_rank_has_its_own_tmpdir_removed_with_its_attempt(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    gang = one_pool_gang("job-t", 1, ["n0", "n1"], (PY, "-c", WRITE), (),
                         out=tmp_path / "out")
    compute.start_workers(gang)
    poll_until(compute, lambda: exited(recorder))
    seen = [json.loads(compute.log_path("job-t", 1, r).read_text().strip().splitlines()[-1])
            for r in (0, 1)]
    dirs = {s["tmpdir"] for s in seen}
    assert len(dirs) == 2 and all(d and d.startswith("/tmp/mtc-rank-") for d in dirs)
    assert all(s["made"].startswith(s["tmpdir"] + "/") for s in seen)  # tempfile used it
    assert not any(Path(d).exists() for d in dirs)  # nothing left on the node


def test_a_job_that_names_its_tmpdir_keeps_it(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    mine = tmp_path / "mine"
    mine.mkdir()
    gang = one_pool_gang("job-m", 1, ["n0"], (PY, "-c", WRITE), (("TMPDIR", str(mine)),),
                         out=tmp_path / "out")
    compute.start_workers(gang)
    poll_until(compute, lambda: exited(recorder))
    seen = json.loads(compute.log_path("job-m", 1, 0).read_text().strip().splitlines()[-1])
    assert seen["tmpdir"] == str(mine) and Path(seen["made"]).exists()


def test_a_killed_launchers_tmpdir_goes_with_the_attempt(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    wait = "import sys, time; print('up', flush=True); time.sleep(60)"
    gang = one_pool_gang("job-k", 1, ["n0"], (PY, "-c", wait), (), out=tmp_path / "out")
    compute.start_workers(gang)
    (worker,) = compute.workers("job-k")
    exit_file = compute.state_dir / "run" / "job-k" / "attempt-1-rank-0.exit"
    where = rank_tmp(exit_file)
    assert where.is_dir()
    os.killpg(worker.pid, signal.SIGKILL)  # launcher and program: no clean-up of its own
    poll_until(compute, lambda: exited(recorder))
    assert not where.exists()
