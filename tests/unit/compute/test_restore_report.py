"""What the ranks restored reaches the control plane: from the SDK's heartbeats to one
``JobRestored`` per attempt, naming the tier that failed, why, and the tier used."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mtc_program import protocol as n
from mtc_program.tiers import TieredCheckpointer, TierSettings
from shared.adapters.compute.ledger import MemoryLedger
from shared.adapters.compute.protocol import progress_path
from shared.adapters.compute.restores import report_restore


def settings(root: Path, rank: int, attempt: int) -> TierSettings:
    ckpt = root / "checkpoints"
    return TierSettings(rank=rank, world_size=2, durable_dir=ckpt,
                        tier1_dir=root / f"n{rank}" / f"rank-{rank}",
                        tier2_dir=root / f"n{1 - rank}" / "peer" / f"rank-{rank}",
                        tier1_every=5, tier2_every=5, tier3_every=10, replicated=False,
                        progress_file=progress_path(ckpt, rank), progress_interval_s=0.0,
                        attempt=attempt, restore_timeout_s=10.0)


def test_a_corrupted_memory_entry_is_reported_with_the_tier_used(tmp_path: Path) -> None:
    for rank in (0, 1):
        cp = TieredCheckpointer(settings(tmp_path, rank, 1), log=lambda _: None)
        for step in range(1, 11):
            cp.maybe_save(step, {"w": np.full(3, float(step))})
        cp.close()
    payload = tmp_path / "n1" / "rank-1" / n.entry_name(10) / n.PAYLOAD
    payload.write_bytes(payload.read_bytes()[::-1])  # rank 1's memory entry: bad bytes

    ledger, ckpt = MemoryLedger(), str(tmp_path / "checkpoints")
    with ThreadPoolExecutor(2) as pool:  # the ranks restore together (they agree on a step)
        got = list(pool.map(lambda r: TieredCheckpointer(settings(tmp_path, r, 2),
                                                         log=lambda _: None).restore(), (0, 1)))
    assert [(r.step, r.tier) for r in got if r] == [(10, "memory"), (10, "peer")]
    event = report_restore(ledger, "j1", 2, ckpt, 2, now=1.0)
    assert event is not None and event.step == 10 and event.tiers == ("memory", "peer")
    assert event.failed == ("rank 1: memory step 10: sha256 does not match its manifest",)
    assert report_restore(ledger, "j1", 2, ckpt, 2, now=2.0, ended=True) is None  # once


def test_an_attempt_that_ended_reports_what_the_ranks_that_got_that_far_said(
        tmp_path: Path) -> None:
    cp = TieredCheckpointer(settings(tmp_path, 0, 3), log=lambda _: None)
    cp._restored(None, None)  # rank 0 found nothing; rank 1 never said
    cp._heartbeat(force=True)
    ledger, ckpt = MemoryLedger(), str(tmp_path / "checkpoints")
    assert report_restore(ledger, "j1", 3, ckpt, 2, now=1.0) is None  # rank 1 may yet say
    event = report_restore(ledger, "j1", 3, ckpt, 2, now=2.0, ended=True)
    assert event is not None and event.step == -1 and event.tiers == ()
