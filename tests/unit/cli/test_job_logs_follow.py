"""`mtc job logs --follow` against a scripted API: it polls from the token, never prints a
line twice, moves on to a restart's new attempt, and ends with the job; --tail."""

from __future__ import annotations

import argparse
from typing import Any

from services.api.names import Parent
from services.cli.commands_logs import cmd_job_logs


class Script:
    """A job whose attempt 1 writes a, b, then c; attempt 2 writes d; then it succeeds."""

    def __init__(self) -> None:
        self.calls = 0
        self.logs = {1: ["a", "b"], 2: []}
        self.ended = {1: False, 2: False}
        self.latest = 1
        self.state = "JOB_STATE_RUNNING"

    def advance(self) -> None:  # what happens while the follower sleeps
        self.calls += 1
        if self.calls == 1:
            self.logs[1].append("c")
        elif self.calls == 2:
            self.ended[1], self.latest = True, 2
        elif self.calls == 3:
            self.logs[2].append("d")
        elif self.calls == 4:
            self.ended[2], self.state = True, "JOB_STATE_SUCCEEDED"

    def read_job_logs(self, parent: Parent, job_id: str, *, attempt: int | None = None,
                      rank: int | None = None, token: str | None = None) -> dict[str, Any]:
        attempt = attempt or self.latest
        start = int(token) if token else 0
        lines = self.logs[attempt][start:]
        end = start + len(lines)
        done = self.ended[attempt] and end == len(self.logs[attempt])
        return {"lines": lines, "nextPageToken": "" if done else str(end), "attempt": attempt,
                "latestAttempt": self.latest}

    def get_job(self, parent: Parent, job_id: str) -> dict[str, Any]:
        return {"state": self.state}


def args(**kw: Any) -> argparse.Namespace:
    base = {"parent": Parent("p", "l"), "job_id": "j", "rank": None, "attempt": None,
            "tail": None, "follow": True}
    return argparse.Namespace(**{**base, **kw})


def run(a: argparse.Namespace, script: Script) -> list[str]:
    out: list[str] = []
    polls = [0]

    def sleep(_: float) -> None:
        polls[0] += 1
        assert polls[0] < 50, "the follower never ended"
        script.advance()

    cmd_job_logs(a, script, out=out.append, sleep=sleep)  # type: ignore[arg-type]
    return out


def test_follow_goes_on_into_the_next_attempt_and_ends_with_the_job() -> None:
    assert run(args(), Script()) == ["a", "b", "c", "d"]


def test_follow_of_a_pinned_attempt_ends_with_it() -> None:
    assert run(args(attempt=1), Script()) == ["a", "b", "c"]


def test_without_follow_it_prints_what_is_there() -> None:
    assert run(args(follow=False), Script()) == ["a", "b"]
    assert run(args(follow=False, tail=1), Script()) == ["b"]
    assert run(args(tail=1), Script()) == ["b", "c", "d"]
