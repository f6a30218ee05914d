"""What an attempt's ranks restored, from their heartbeats (``restore``, written by the
in-job SDK's tiers): one ``JobRestored`` per attempt, the local and the Slurm adapters alike.

A restore that fell back (an entry that failed its check, a tier the control plane skipped)
is what the job's timeline must show: the tier that failed, why, and the tier used. It is
reported once every rank has said, or when the attempt ends with what the ranks that got
that far said (a program that crashes on every restore still says what it read first).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mtc_program import protocol as p
from shared.adapters.compute.ledger import LedgerStore
from shared.adapters.compute.protocol import progress_path
from shared.domain.events import JobRestored

KEEP_FAILED = 8  # failed entries named in the event; the rest are counted


def restores(checkpoint_dir: str, attempt: int, world_size: int) -> dict[int, Mapping[str, Any]]:
    """Each rank's ``restore`` record of ``attempt`` (ranks without one are left out)."""
    out: dict[int, Mapping[str, Any]] = {}
    for rank in range(world_size):
        try:
            beat = json.loads(progress_path(checkpoint_dir, rank).read_text())
        except (OSError, ValueError):
            continue
        said = beat.get("restore") if isinstance(beat, dict) else None
        if beat.get("attempt") == attempt and isinstance(said, dict):
            out[rank] = said
    return out


def restored_event(job_id: str, attempt: int, said: Mapping[int, Mapping[str, Any]]
                   ) -> JobRestored:
    steps = [s for r in said.values() if isinstance(s := r.get("step"), int)]
    used = {str(r.get("tier")) for r in said.values() if r.get("tier")}
    failed = [f"rank {rank}: {f.get('tier')} step {f.get('step')}: {f.get('why')}"
              for rank, r in sorted(said.items()) for f in _list(r.get("failed"))
              if isinstance(f, dict)]
    if len(failed) > KEEP_FAILED:
        failed = [*failed[:KEEP_FAILED], f"... and {len(failed) - KEEP_FAILED} more"]
    skipped = {str(t) for r in said.values() for t in _list(r.get("skipped"))}
    return JobRestored(job_id=job_id, attempt=attempt, step=min(steps) if steps else -1,
                       tiers=tuple(t for t in p.TIERS if t in used), failed=tuple(failed),
                       skipped=tuple(t for t in p.TIERS if t in skipped))


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def report_restore(store: LedgerStore, job_id: str, attempt: int, checkpoint_dir: str,
                   world_size: int, now: float, ended: bool = False) -> JobRestored | None:
    """The attempt's ``JobRestored``, once: when every rank has said, or (``ended``) when
    the attempt is over and at least one had. None for a program that does not say."""
    key = f"{checkpoint_dir}#restore"
    if attempt in store.seen_steps(key):
        return None
    said = restores(checkpoint_dir, attempt, world_size)
    if not said or (len(said) < world_size and not ended):
        return None
    if store.checkpoint(key, attempt, job_id, attempt, "", now):
        return restored_event(job_id, attempt, said)
    return None
