"""When a job's disk counts as full (``shared.domain.storage``), and what that makes of an
exit (``shared.domain.exits``): the file system's state is the evidence, not the message."""

from __future__ import annotations

import pytest

from shared.domain import exits, storage
from shared.domain.errors import ValidationError
from shared.domain.storage import MIB, Reading, StorageFloor

FLOOR = StorageFloor()  # 64 MiB, or 1 % of a small disk; 5 % when the rank said ENOSPC
TB = 1 << 40


@pytest.mark.parametrize(("free", "total", "is_full"), [
    (0, 8 * MIB, True),                    # filled to the last block
    (80 * 1024, 8 * MIB, True),            # under 1 % of a small disk
    (100 * 1024, 8 * MIB, False),          # over it
    (63 * MIB, TB, True),                  # a big disk: under 64 MiB is full
    (65 * MIB, TB, False),                 # 1 % of it would be 10 GiB: the floor is 64 MiB
    (0, 0, False),                         # nothing read: no evidence
])
def test_the_floor_is_64_mib_or_1_percent_of_a_small_disk(free: int, total: int,
                                                          is_full: bool) -> None:
    assert storage.full(free, total, FLOOR) is is_full


def test_a_rank_that_said_enospc_counts_a_nearly_full_disk() -> None:
    """Its own failed write freed what it had taken before the launcher looked: 3 % free
    of a disk is full for a rank that said ENOSPC, not for one that said nothing."""
    nearly = Reading("/jobs/j1/checkpoints", int(0.03 * 256 * MIB), 256 * MIB)
    assert storage.full_at([nearly], enospc=True, floor=FLOOR) == nearly
    assert storage.full_at([nearly], enospc=False, floor=FLOOR) is None


def test_enospc_on_a_disk_with_room_stays_the_programs() -> None:
    """A quota or the program's own bug: it says ENOSPC, the file system has room."""
    roomy = Reading("/jobs/j1/checkpoints", 100 * MIB, 256 * MIB)
    assert storage.full_at([roomy], enospc=True, floor=FLOOR) is None


def test_the_first_full_file_system_is_named() -> None:
    readings = [Reading("/ok", 200 * MIB, TB), Reading("/full", 0, 8 * MIB),
                Reading("/also-full", 0, 8 * MIB)]
    hit = storage.full_at(readings, enospc=False, floor=FLOOR)
    assert hit is not None and hit.path == "/full"
    assert storage.describe(hit) == "disk full at /full (0 B free of 8.0 MiB)"


def test_the_floor_is_configurable_and_checked() -> None:
    small = StorageFloor(min_free_bytes=1 * MIB, min_free_fraction=0.5)
    assert storage.full(900 * 1024, TB, small) and not storage.full(2 * MIB, TB, small)
    with pytest.raises(ValidationError, match="min_free_fraction"):
        StorageFloor(min_free_fraction=1.5)
    with pytest.raises(ValidationError, match="min_free_bytes"):
        StorageFloor(min_free_bytes=-1)


def test_storage_full_is_infrastructure_evidence() -> None:
    """Exit 1 alone is the program's; with the full disk as evidence it is an interruption,
    and the verdict restarts the job (within its budget and deadline) instead of failing it."""
    assert not exits.infrastructure_ended(1, interrupted=False, node_fault=False)
    ended = exits.infrastructure_ended(1, interrupted=False, node_fault=False, storage_full=True)
    assert ended
    assert exits.exit_verdict(1, interrupted=ended, restart_anyway=False, restarts=0,
                              max_restarts=3) is exits.Verdict.RESTART
    assert exits.exit_verdict(1, interrupted=False, restart_anyway=False, restarts=0,
                              max_restarts=3) is exits.Verdict.FAILED
