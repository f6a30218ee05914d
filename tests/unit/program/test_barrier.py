"""The SDK's file barrier (``mtc_program.cut.barrier``, which examples/train.py takes at its
memory-tier steps): ranks wait for each other (so their tier entries share steps, as a
data-parallel job's do), and a dead peer never deadlocks a rank."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from mtc_program.cut import barrier


def at(tmp_path: Path, rank: int, step: int, stop: Callable[[], bool], world_size: int = 2) -> bool:
    return barrier(tmp_path, rank, world_size, 3, step, stop)


def test_a_rank_waits_at_the_barrier_until_its_peer_arrives(tmp_path: Path) -> None:
    passed: list[float] = []
    waiter = threading.Thread(target=lambda: passed.append(
        time.monotonic() if at(tmp_path, 0, 10, lambda: False) else -1.0))
    waiter.start()
    time.sleep(0.3)
    assert not passed  # rank 1 has not reached step 10
    at(tmp_path, 1, 5, lambda: True)  # an earlier step does not release it
    time.sleep(0.1)
    assert not passed
    arrived = time.monotonic()
    assert at(tmp_path, 1, 10, lambda: False)  # rank 0 is there already
    waiter.join(5)
    assert passed and passed[0] >= arrived


def test_a_dead_peer_does_not_deadlock_a_rank_told_to_stop(tmp_path: Path) -> None:
    asked = time.monotonic() + 0.2
    assert not at(tmp_path, 0, 10, lambda: time.monotonic() > asked, world_size=3)
    assert at(tmp_path, 0, 10, lambda: False, world_size=1)  # alone: nothing to wait for
