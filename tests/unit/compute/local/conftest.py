"""Fixtures for the LocalCompute tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from local_compute_support import FakeClock

from shared.adapters.compute.local.compute import LocalCompute
from tests.harness import Recorder


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def make_compute(
    state_dir: Path, clock: FakeClock, recorder: Recorder
) -> Iterator[Callable[..., LocalCompute]]:
    """Build LocalCompute instances on one state dir; every live worker is killed after."""
    made: list[LocalCompute] = []

    def make(**kwargs: Any) -> LocalCompute:
        kwargs.setdefault("heartbeats", False)
        kwargs.setdefault("emit", recorder)
        compute = LocalCompute(state_dir, kwargs.pop("emit"), clock, **kwargs)
        made.append(compute)
        return compute

    yield make
    for compute in made:
        compute.kill_all()
        compute.close()
