"""Preemption as the worker protocol asks for it: SIGTERM (or SIGINT) becomes a flag the
training loop reads between steps; the program then saves and exits ``PREEMPTED`` (75)
within the grace period (standard library only).

A handler that only sets a flag is safe at any point of a step; the loop decides when to
stop, so a checkpoint is never written from inside a signal handler."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from types import FrameType


class Preemption:
    """SIGTERM/SIGINT become ``signum``, read between steps (install it first thing in
    ``main``, so a signal during start-up is not lost)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> Preemption:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def name(self) -> str:
        """The signal's name (``SIGTERM``), '' while none came."""
        return "" if self.signum is None else signal.Signals(self.signum).name

    def sleep(self, seconds: float, wake: Callable[[], bool] | None = None) -> None:
        """Sleep, but wake soon after a signal (or when ``wake()`` says so, e.g. an order to
        hold), so preemption is prompt."""
        deadline = time.monotonic() + seconds
        while self.signum is None and (left := deadline - time.monotonic()) > 0:
            if wake is not None and wake():
                return
            time.sleep(min(left, 0.02))
