"""examples/train.py's file barrier at tier-1 steps: ranks wait for each other (so their tier
entries share steps, as a data-parallel job's do), and a dead peer never deadlocks a rank."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from tests.unit.examples.test_train_example import TRAIN


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_barrier_under_test", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


train = load()


def env(tmp_path: Path, rank: int, world_size: int = 2) -> object:
    return train.Env("job", rank, world_size, "127.0.0.1", None, None, tmp_path, tmp_path,
                     None, 3)


def test_a_rank_waits_at_the_barrier_until_its_peer_arrives(tmp_path: Path) -> None:
    passed: list[float] = []
    waiter = threading.Thread(target=lambda: passed.append(
        time.monotonic() if train.barrier(env(tmp_path, 0), 10, lambda: False) else -1.0))
    waiter.start()
    time.sleep(0.3)
    assert not passed  # rank 1 has not reached step 10
    train.barrier(env(tmp_path, 1), 5, lambda: True)  # an earlier step does not release it
    time.sleep(0.1)
    assert not passed
    arrived = time.monotonic()
    assert train.barrier(env(tmp_path, 1), 10, lambda: False)  # rank 0 is there already
    waiter.join(5)
    assert passed and passed[0] >= arrived


def test_a_dead_peer_does_not_deadlock_a_rank_told_to_stop(tmp_path: Path) -> None:
    asked = time.monotonic() + 0.2
    assert not train.barrier(env(tmp_path, 0, 3), 10, lambda: time.monotonic() > asked)
    assert train.barrier(env(tmp_path, 0, 1), 10, lambda: False)  # alone: nothing to wait for
