"""What the load benchmarks share: percentiles of call latencies, what counts as a failed
call, and the CPU each process used (``bench/stack_load.py``, ``bench/api_load.py``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

Call = tuple[Any, ...]  # (kind, status, seconds, ...): one timed call


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank); NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def failed(status: str) -> bool:
    """No answer, or an answer >= 400 (after the retries)."""
    return not status.isdigit() or int(status) >= 400


def quantiles(calls: list[Call]) -> dict[str, float | None]:
    """p50/p99 in ms of the calls' latencies; None when there were none."""
    seconds = [c[2] for c in calls]
    return {f"p{q}_ms": round(pct(seconds, q) * 1000, 1) if seconds else None
            for q in (50, 99)}


class CpuMeter:
    """CPU time of named processes and all their descendants (``/proc/<pid>/stat``
    utime+stime; a process counts for its nearest named ancestor: a function's gunicorn
    worker for the function, this process only for itself) and of the whole machine
    (``/proc/stat``), between construction and ``percent``: 100 is one core busy."""

    TICKS = os.sysconf("SC_CLK_TCK")

    def __init__(self, pids: dict[str, int]) -> None:
        self.names = {pid: name for name, pid in pids.items()}
        self.t0 = time.monotonic()
        self.before = self._sample()

    def _sample(self) -> dict[str, float]:
        parents: dict[int, int] = {}
        ticks: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents[int(entry.name)] = int(fields[1])
            ticks[int(entry.name)] = int(fields[11]) + int(fields[12])
        out = dict.fromkeys(self.names.values(), 0.0)
        for pid, used in ticks.items():
            up, seen = pid, 0
            while up not in self.names and up in parents and seen < 64:
                up, seen = parents[up], seen + 1
            if up in self.names:
                out[self.names[up]] += used / self.TICKS
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        idle = int(cpu[3]) + int(cpu[4])
        out["machine"] = (sum(int(x) for x in cpu[:8]) - idle) / self.TICKS
        return out

    def percent(self) -> dict[str, float]:
        """Busy percent of each name since construction (a process that ended in between
        takes its time with it: the figures are a floor)."""
        after, wall = self._sample(), time.monotonic() - self.t0
        return {name: round(max(0.0, 100 * (after[name] - self.before[name]) / wall), 1)
                for name in after}
