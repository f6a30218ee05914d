"""Helpers for the LocalCompute tests: a fake clock and real-time polling."""

from __future__ import annotations

import time
from collections.abc import Callable

from shared.adapters.compute.local.compute import LocalCompute
from tests.harness import ManualClock


class FakeClock(ManualClock):
    def __init__(self, t: float = 1000.0) -> None:
        super().__init__(t)


def poll_until(compute: LocalCompute, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll in real time until ``done()``: workers are real processes."""
    deadline = time.monotonic() + timeout_s
    while True:
        compute.poll()
        if done():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def run_to_exit(compute: LocalCompute, job_id: str, timeout_s: float = 60.0) -> int:
    """Poll until every rank of ``job_id`` has an exit code; rank 0's."""
    codes: list[int | None] = []

    def ended() -> bool:
        codes[:] = [w.exit_code for w in compute.workers(job_id)]
        return bool(codes) and all(c is not None for c in codes)

    poll_until(compute, ended, timeout_s)
    return int(codes[0])  # type: ignore[arg-type]
