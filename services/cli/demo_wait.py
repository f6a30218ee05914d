"""Waiting in the demos: for what the story expects next, and no longer once it cannot come.

A demo waits for its jobs' attempt numbers, checkpoints and resumes. When every job a wait
is about has already ended (it finished before the story's next fault, or failed), nothing
it waits for can happen any more: the demo stops at once and says what it expected and did
not see (a non-zero exit), instead of waiting out its timeout and blaming the clock. A wait
for something else (a cluster to be READY, a node to return after its job ended) names no
job and waits as long as its timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from shared.domain.model import Job


class _App(Protocol):
    def run(self, until: Callable[[], bool], *, timeout_s: float, poll_s: float = ...,
            tick_s: float = ...) -> bool: ...

    def transaction(self) -> Any: ...


def wait(app: _App, prog: str, what: str, until: Callable[[], bool], *,
         jobs: Sequence[str] = (), timeout_s: float, tick_s: float, poll_s: float = 0.05
         ) -> None:
    """Pump ``app`` until ``until()``; stop at once when every job in ``jobs`` has ended
    without it (``SystemExit`` saying what was missed), or after ``timeout_s``."""
    app.run(lambda: until() or bool(ended(app, jobs)), timeout_s=timeout_s, poll_s=poll_s,
            tick_s=tick_s)
    if until():
        return
    over = ended(app, jobs)
    if over:
        raise SystemExit(f"{prog}: stopped waiting for {what}: " + "; ".join(map(_ended, over))
                         + ", so it will not happen (the story expected it next)")
    raise SystemExit(f"{prog}: timed out waiting for {what}")


def ended(app: _App, job_ids: Sequence[str]) -> list[Job]:
    """The jobs ``job_ids``, when every one of them is terminal; [] otherwise."""
    if not job_ids:
        return []
    with app.transaction() as uow:
        found = [uow.jobs.get(j) for j in job_ids]
    return found if all(j is not None and j.terminal for j in found) else []


def _ended(job: Job) -> str:
    error = f": {job.error}" if job.error else ""
    return (f"{job.job_id} already ended {job.state.value} at attempt {job.attempt} after "
            f"{job.restart_count} restart(s){error}")
