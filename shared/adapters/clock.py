"""The Clock port on the machine's wall clock (the simulator has its own, on SimPy time)."""

from __future__ import annotations

import time


class SystemClock:
    def now(self) -> float:
        return time.time()
