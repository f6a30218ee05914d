"""``mtc job get`` prints a waiting job's place in its team's queue under its row."""

from __future__ import annotations

from services.cli.commands_api import queue_line


def test_a_waiting_job_shows_its_queue_and_reason() -> None:
    job = {"mtcProgress": {"queue": {"team": "a", "partition": "gpu", "position": 2,
                                     "reason": "waiting to borrow: partition gpu has 0 nodes free"}}}
    assert queue_line(job) == ("queue: team a on gpu, position 2: waiting to borrow: "
                               "partition gpu has 0 nodes free")


def test_a_job_outside_queues_shows_none() -> None:
    assert queue_line({"mtcProgress": {"attempt": 1}}) is None
    assert queue_line({}) is None
