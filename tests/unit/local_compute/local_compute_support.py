"""Helpers for the LocalCompute tests: a fake clock, an event recorder, real-time polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shared.adapters.local_compute import LocalCompute
from shared.domain.events import Event

E = TypeVar("E", bound=Event)


@dataclass
class FakeClock:
    t: float = 1000.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Recorder:
    events: list[Event] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]


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
