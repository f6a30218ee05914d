"""When the disk that holds a job's files counts as full (pure; the readings come from the
compute adapter, which looks).

A rank that cannot write its checkpoint because the file system is full exits non-zero like
a program that failed; only the file system's state tells the two apart. The worker launcher
reads the file systems of the job's checkpoint, model and log directories (``statvfs``) the
moment its rank exits non-zero, and whether the rank's last output says ``No space left on
device``; this module decides from those readings:

* a file system with less free than the **floor** is full, whatever the program said: the
  floor is ``min(min_free_bytes, min_free_fraction x size)`` (64 MiB, or 1 % of a small disk);
* a rank that reported ENOSPC counts a looser mark as full (``enospc_fraction`` of the size):
  its own failed write may have freed what it had taken before the launcher looked;
* ENOSPC on a file system with room (a quota, the program's own bug) is the program's.

A job whose attempt ended so is interrupted, not failed (``exits.infrastructure_ended``), and
waits (PENDING) until its file system has more than the floor free again (:func:`full` on a
fresh reading, on the controller's tick).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from shared.domain.errors import ValidationError

CAUSE = "storage_full"  # the interruption cause (goodput, the requeue reason's prefix)
MIB = 1 << 20


@dataclass(frozen=True)
class StorageFloor:
    """How little free space makes a job's file system full (see the module)."""

    min_free_bytes: int = 64 * MIB
    min_free_fraction: float = 0.01
    enospc_fraction: float = 0.05  # a rank that said ENOSPC: full below this share free

    def __post_init__(self) -> None:
        if self.min_free_bytes < 0:
            raise ValidationError("min_free_bytes", "must not be negative")
        for name in ("min_free_fraction", "enospc_fraction"):
            value = getattr(self, name)
            if not math.isfinite(value) or not 0 <= value < 1:
                raise ValidationError(name, "must be a fraction in [0, 1)")


class Reading(NamedTuple):
    """One file system as ``statvfs`` saw it: free bytes (for an unprivileged writer) of
    ``total``, through ``path``."""

    path: str
    free: int
    total: int


def floor_bytes(total: int, floor: StorageFloor) -> int:
    """The free space below which a file system of ``total`` bytes is full."""
    return min(floor.min_free_bytes, int(floor.min_free_fraction * max(0, total)))


def full(free: int, total: int, floor: StorageFloor) -> bool:
    """Whether a file system with ``free`` of ``total`` bytes free is full (below the floor)."""
    return total > 0 and free < floor_bytes(total, floor)


def limit(total: int, enospc: bool, floor: StorageFloor) -> int:
    """The free space below which a file system of ``total`` bytes counts as full at a rank's
    exit: the floor, or the looser ENOSPC mark when the rank reported ENOSPC."""
    if not enospc:
        return floor_bytes(total, floor)
    return max(floor_bytes(total, floor), int(floor.enospc_fraction * max(0, total)))


def full_at(readings: Iterable[Reading], enospc: bool, floor: StorageFloor) -> Reading | None:
    """The first reading whose file system counts as full at the rank's exit, or None:
    nothing says the disk is to blame."""
    for reading in readings:
        if reading.total > 0 and reading.free < limit(reading.total, enospc, floor):
            return reading
    return None


def size(n: float) -> str:
    """``12 KiB``, ``8.0 MiB``: a byte count for people."""
    if n < 1024 * 1024:
        return f"{n:.0f} B" if n < 1024 else f"{n / 1024:.0f} KiB"
    return f"{n / MIB:.1f} MiB" if n < 1024 * MIB else f"{n / (1024 * MIB):.1f} GiB"


def describe(reading: Reading) -> str:
    """``disk full at PATH (12 KiB free of 8.0 MiB)``: what the timeline and the error say."""
    return f"disk full at {reading.path} ({size(reading.free)} free of {size(reading.total)})"


def wait_reason(path: str, exit_detail: str) -> str:
    """The requeue reason of an attempt the full disk ended; its prefix is the cause."""
    return f"{CAUSE}: disk full at {path}; the job waits for space and resumes from its " \
        f"checkpoint ({exit_detail})"
