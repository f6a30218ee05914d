"""A plain program (nothing of mtc imported) that names its checkpoints its own way: real
worker processes on the local compute. What it saved before exiting 0 or 75 is a checkpoint,
reported before the attempt's end, so the next attempt starts from it; a file a failed
program had just written may be torn and waits until it has settled."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from local_compute_support import poll_until

from shared.adapters.compute.local.compute import LocalCompute
from shared.domain.events import JobCheckpointSaved, JobWorkersExited
from tests.harness import Recorder, one_pool_gang

pytestmark = pytest.mark.slow  # real worker subprocesses

# saves the way many programs do (torch.save straight to its path), not atomically
PLAIN = textwrap.dedent(
    """
    import os, sys
    d = os.environ["AIP_CHECKPOINT_DIR"]
    with open(os.path.join(d, "step-000120.pt"), "wb") as f:
        f.write(b"weights")
    with open(os.path.join(d, "model.pt"), "wb") as f:
        f.write(b"no step in this name")
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.mark.parametrize("code", [75, 0])
def test_a_program_that_ended_well_has_its_checkpoint_counted(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path, code: int
) -> None:
    compute = make_compute()
    compute.start_workers(one_pool_gang("plain", 1, ("n0",), (sys.executable, "-c", PLAIN,
                                                               str(code)), out=tmp_path / "out"))
    poll_until(compute, lambda: bool(recorder.of(JobWorkersExited)))
    kinds = [(type(e).__name__, getattr(e, "step", None)) for e in recorder.events
             if isinstance(e, JobCheckpointSaved | JobWorkersExited)]
    assert kinds == [("JobCheckpointSaved", 120), ("JobWorkersExited", None)]
    assert Path(recorder.of(JobCheckpointSaved)[0].path).name == "step-000120.pt"


def test_a_file_a_failed_program_just_wrote_is_not_counted_yet(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    compute.start_workers(one_pool_gang("plain", 1, ("n0",), (sys.executable, "-c", PLAIN, "1"),
                                        out=tmp_path / "out"))
    poll_until(compute, lambda: bool(recorder.of(JobWorkersExited)))
    assert recorder.of(JobCheckpointSaved) == []
