"""The demos stop waiting for the story's next event once the job it is about has ended,
saying what they expected and did not see; what still may come is waited for."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.cli import demo, demo_tiers, demo_torch
from services.cli.demo_wait import wait
from shared.domain.model import JobState

POLLS = 1000  # what a timeout of TIMEOUT_S would pump, roughly


class _Jobs:
    def __init__(self, jobs: dict[str, Any]) -> None:
        self.jobs = jobs

    def get(self, job_id: str) -> Any:
        return self.jobs.get(job_id)


class _Uow:
    def __init__(self, jobs: dict[str, Any]) -> None:
        self.jobs = _Jobs(jobs)


class _App:
    """Pumps ``until`` as EmbeddedApp.run does, counting the polls instead of sleeping."""

    def __init__(self, **jobs: Any) -> None:
        self._jobs = jobs
        self.polls = 0

    def run(self, until: Callable[[], bool], *, timeout_s: float, poll_s: float = 0.1,
            tick_s: float = 5.0) -> bool:
        for _ in range(POLLS):
            self.polls += 1
            if until():
                return True
        return False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_Uow]:
        yield _Uow(self._jobs)


class _Job:
    def __init__(self, job_id: str, state: JobState, attempt: int, error: str = "") -> None:
        self.job_id, self.state, self.attempt, self.error = job_id, state, attempt, error
        self.restart_count = attempt - 1

    @property
    def terminal(self) -> bool:
        return self.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


def test_a_job_that_already_ended_stops_the_wait_at_once() -> None:
    app = _App(j=_Job("j", JobState.SUCCEEDED, 2))
    with pytest.raises(SystemExit) as stopped:
        wait(app, "demo", "attempt 3 to save to memory", lambda: False, jobs=["j"],
             timeout_s=60, tick_s=1)
    assert app.polls == 1
    assert str(stopped.value.code) == (
        "demo: stopped waiting for attempt 3 to save to memory: j already ended "
        "JOB_STATE_SUCCEEDED at attempt 2 after 1 restart(s), so it will not happen "
        "(the story expected it next)")


def test_what_came_counts_even_when_the_job_ended() -> None:
    app = _App(j=_Job("j", JobState.SUCCEEDED, 2))
    wait(app, "demo", "the job to end", lambda: True, jobs=["j"], timeout_s=60, tick_s=1)


def test_a_running_job_or_no_job_waits_out_the_timeout() -> None:
    for app, jobs in ((_App(j=_Job("j", JobState.RUNNING, 1)), ["j"]), (_App(), [])):
        with pytest.raises(SystemExit) as stopped:
            wait(app, "demo", "a checkpoint", lambda: False, jobs=jobs, timeout_s=60,
                 tick_s=1)
        assert app.polls == POLLS
        assert stopped.value.code == "demo: timed out waiting for a checkpoint"


def test_a_failed_job_says_why() -> None:
    app = _App(j=_Job("j", JobState.FAILED, 1, "worker exited with code 126"))
    with pytest.raises(SystemExit) as stopped:
        wait(app, "demo-torch", "a checkpoint", lambda: False, jobs=["j"], timeout_s=60,
             tick_s=1)
    assert "FAILED at attempt 1 after 0 restart(s): worker exited with code 126" in str(
        stopped.value.code)


@pytest.mark.parametrize("module, job_id", [(demo, "train-1"), (demo_tiers, demo_tiers.JOB_ID),
                                             (demo_torch, demo_torch.JOB_ID)])
def test_each_demo_stops_on_its_job(module: Any, job_id: str) -> None:
    app = _App(**{job_id: _Job(job_id, JobState.SUCCEEDED, 2)})
    with pytest.raises(SystemExit) as stopped:
        module._wait(app, "attempt 3", lambda: False, job_id)
    assert app.polls == 1 and f"{job_id} already ended" in str(stopped.value.code)
