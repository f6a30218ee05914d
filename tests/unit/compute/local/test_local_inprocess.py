"""The local compute's in-process restart (``shared.adapters.compute.local.inprocess``) with
``examples/train.py`` (durable checkpoints only, one rank): a stop holds the program, which
saves and answers, so its attempt ends with 75; the next in-place attempt takes the same
process; a requeue ends it as today (SIGTERM, exit 75 from the program itself)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from local_compute_support import poll_until

from shared.adapters.compute.local.compute import LocalCompute
from shared.domain.events import JobCheckpointSaved, JobWorkersExited
from shared.ports import RecoveryPlan
from tests.harness import Recorder, one_pool_gang

TRAIN = Path(__file__).resolve().parents[4] / "examples" / "train.py"
CMD = (sys.executable, str(TRAIN), "--steps", "100000", "--checkpoint-every", "5",
       "--step-time", "0.01")

pytestmark = pytest.mark.slow  # real worker processes


def exits(recorder: Recorder) -> list[JobWorkersExited]:
    return [e for e in recorder.events if isinstance(e, JobWorkersExited)]


def started(compute: LocalCompute, recorder: Recorder, tmp_path: Path) -> LocalCompute:
    compute.start_workers(one_pool_gang("job-1", 1, ["n0"], CMD, out=tmp_path / "out"))
    poll_until(compute, lambda: bool(recorder.of(JobCheckpointSaved)))
    compute.signal_workers("job-1", 1, grace_s=30.0)
    poll_until(compute, lambda: bool(exits(recorder)))
    return compute


def test_a_stopped_rank_is_held_and_the_in_place_attempt_takes_its_process(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = started(make_compute(), recorder, tmp_path)
    [exited] = exits(recorder)
    assert exited.exit_code == 75  # what it would have exited with: its save is complete
    [first] = compute.workers("job-1")
    assert "held at step" in Path(first.log_path).read_text()
    compute.start_workers(replace(one_pool_gang("job-1", 2, ["n0"], CMD, out=tmp_path / "out"),
                                  recovery=RecoveryPlan("in_place")))
    [second] = [w for w in compute.workers("job-1") if w.attempt == 2]
    assert second.pid == first.pid and second.log_path != first.log_path
    log = Path(second.log_path)
    poll_until(compute, lambda: log.exists() and "resumed from step" in log.read_text())
    assert "resumed from step" not in Path(first.log_path).read_text().split("held at step")[1]
    compute.signal_workers("job-1", 2, grace_s=30.0)  # held again, as attempt 2's rank
    poll_until(compute, lambda: len(exits(recorder)) == 2)
    assert exits(recorder)[1].exit_code == 75


def test_a_held_rank_not_taken_gets_sigterm_and_exits_75_itself(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = started(make_compute(), recorder, tmp_path)
    [first] = compute.workers("job-1")
    compute.start_workers(one_pool_gang("job-1", 2, ["n0"], CMD, out=tmp_path / "out"))
    [second] = [w for w in compute.workers("job-1") if w.attempt == 2]
    assert second.pid != first.pid  # a requeue: a new process, as today
    log = Path(first.log_path)
    poll_until(compute, lambda: "SIGTERM received" in log.read_text())
    assert log.read_text().count("SIGTERM received") == 1

