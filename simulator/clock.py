"""Simulated time: the Clock port on SimPy's clock, and one-shot timers.

- :data:`EPOCH_S`: simulated time zero, in epoch seconds (2026-01-01T00:00:00Z).
- :class:`SimClock` reads SimPy's clock as epoch seconds.
- :func:`call_later` runs a function after a simulated delay (one SimPy timeout, no process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simpy
from simpy.events import NORMAL, Event

EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z: simulated time zero


class SimClock:
    """The Clock port: epoch seconds, driven by SimPy."""

    def __init__(self, env: simpy.Environment, epoch_s: float = EPOCH_S) -> None:
        self.env = env
        self.epoch_s = epoch_s

    def now(self) -> float:
        return self.epoch_s + float(self.env.now)


def call_later(env: simpy.Environment, delay: float, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(*args)`` after ``delay`` simulated seconds: one SimPy event, no process.

    What ``env.timeout`` does, without its argument checks and its extra call (one of
    these per delivery, report and timer: the twin's most frequent call)."""
    ev = Event.__new__(Event)
    ev.env = env
    ev.callbacks = [lambda _ev: fn(*args)]
    ev._value = None
    ev._ok = True
    env.schedule(ev, NORMAL, delay if delay > 0.0 else 0.0)
