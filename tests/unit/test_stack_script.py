"""scripts/stack_story.py: the `make stack` story waits for what it reads next."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import stack_story  # noqa: E402


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.now += s


def _job(state: str, nodes: list[str], checkpoint: bool = False) -> dict[str, Any]:
    progress: dict[str, Any] = {"attempt": 1, "nodes": nodes}
    if checkpoint:
        progress["latestCheckpoint"] = {"step": "20"}
    return {"name": "projects/p/locations/l/customJobs/train-1", "state": state,
            "mtcProgress": progress}


def test_stack_waits_for_the_job_to_have_nodes() -> None:
    # the race: a checkpoint is listed, but the job holds no nodes yet (or is not RUNNING)
    answers = [_job("JOB_STATE_QUEUED", []), _job("JOB_STATE_RUNNING", [], checkpoint=True),
               _job("JOB_STATE_PENDING", ["", "n2"], checkpoint=True),
               _job("JOB_STATE_RUNNING", ["", ""], checkpoint=True),
               _job("JOB_STATE_RUNNING", ["n1", "n2"]),
               _job("JOB_STATE_RUNNING", ["n1", "n2"], checkpoint=True)]
    reads = iter(answers)
    t = FakeTime()
    job = stack_story.wait_for_running_job(lambda: next(reads), checkpoint=True,
                                           timeout_s=10, poll_s=0.5, clock=t.clock,
                                           sleep=t.sleep)
    assert job is answers[-1] and stack_story.job_nodes(job) == ["n1", "n2"]
    assert t.sleeps == len(answers) - 1
    # without checkpoint=True a RUNNING job with nodes is enough
    reads = iter(answers)
    job = stack_story.wait_for_running_job(lambda: next(reads), clock=t.clock, sleep=t.sleep)
    assert job is answers[4]

    # the deadline: a clear error, naming what it waited for and what it last saw
    t = FakeTime()
    with pytest.raises(stack_story.StoryTimeout, match=r"timed out after 5 s waiting for "
                       r"the job to be RUNNING on its nodes.*nodes \[\]") as exc:
        stack_story.wait_for_running_job(lambda: _job("JOB_STATE_RUNNING", []), timeout_s=5,
                                         poll_s=1, clock=t.clock, sleep=t.sleep)
    assert isinstance(exc.value, SystemExit) and 5 <= t.now <= 6
    # a job that ends while waited on fails at once, not at the deadline
    t = FakeTime()
    with pytest.raises(stack_story.StoryTimeout, match="ended while"):
        stack_story.wait_for_running_job(lambda: _job("JOB_STATE_FAILED", []), timeout_s=60,
                                         clock=t.clock, sleep=t.sleep)
    assert t.now == 0
