"""The consistent cut: the step every rank restores, agreed without a collective; and a
barrier through the same shared directory, for programs that have no collective at all.

Why files and not a collective: a program need not have one (``examples/train.py`` has
none), and the restore runs before any process group exists. Every rank of a job shares its
durable directory (``AIP_CHECKPOINT_DIR``: Vertex's ``baseOutputDirectory``, a shared file
system on Slurm), so each rank posts there the steps it can restore (entries it verified on
the tiers it can reach), waits until every rank of its attempt has posted, and takes the
newest step that all of them can restore. Every rank reads the same files and computes the
same step, so no rank decides for the others and none waits for a chief that may be dead.
A rank that never posts (its process died) ends the gang anyway; the others give up after
``timeout_s`` with ``RestoreError`` rather than guess (a guess could mix steps).

``barrier``: every rank of the attempt reaches a step before any goes on (a file per rank),
so the ranks' tier entries share their steps as a data-parallel job's do; a rank asked to
stop while it waits (a SIGTERM, an order to hold) stops waiting, so a dead peer never
deadlocks it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from mtc_program.entries import atomic_file

RENDEZVOUS = ".mtc-restore"  # under the durable directory; the protocol's scan ignores it
BARRIER = "mtc-barrier"  # likewise: not a checkpoint name


class RestoreError(RuntimeError):
    """The ranks could not agree on a step (one never posted its steps)."""


def rendezvous_dir(durable_dir: Path, attempt: int) -> Path:
    return durable_dir / RENDEZVOUS / f"attempt-{attempt}"


def newest_common(posted: Iterable[Iterable[int]]) -> int | None:
    """The newest step in every rank's set; None when they share none."""
    sets = [set(s) for s in posted]
    if not sets:
        return None
    common = set.intersection(*sets)
    return max(common) if common else None


def agree(steps: Iterable[int], rank: int, world_size: int, durable_dir: Path,
          attempt: int | None, timeout_s: float, log: Callable[[str], None],
          poll_s: float = 0.05) -> int | None:
    """The step every rank of the attempt can restore (see the module docstring); None: start
    from scratch. One rank, or no attempt number (a program run by hand): its own newest."""
    mine = sorted(set(steps))
    if world_size == 1 or attempt is None:
        if world_size > 1:
            log("restore: no MTC_JOB_ATTEMPT, so no agreement across ranks: my newest step")
        return mine[-1] if mine else None
    here = rendezvous_dir(durable_dir, attempt)
    here.mkdir(parents=True, exist_ok=True)
    atomic_file(here / f"rank-{rank}.json", json.dumps({"rank": rank, "steps": mine}).encode())
    if rank == 0:
        _prune(durable_dir / RENDEZVOUS, attempt)
    deadline = time.monotonic() + timeout_s
    while True:
        posted = _read(here, world_size)
        if posted is not None:
            return newest_common(posted)
        if time.monotonic() > deadline:
            raise RestoreError(f"restore: not every rank posted its steps to {here} within "
                               f"{timeout_s:g}s; refusing to guess a step")
        time.sleep(poll_s)


def _read(here: Path, world_size: int) -> list[list[int]] | None:
    out: list[list[int]] = []
    for r in range(world_size):
        try:
            data = json.loads((here / f"rank-{r}.json").read_text())
        except (OSError, ValueError):
            return None
        out.append([int(s) for s in data.get("steps", [])])
    return out


def _prune(root: Path, attempt: int) -> None:
    """Rendezvous directories of attempts before the previous one are done with."""
    try:
        children = list(root.iterdir())
    except OSError:
        return
    for child in children:
        name = child.name.removeprefix("attempt-")
        if name.isdigit() and int(name) < attempt - 1:
            shutil.rmtree(child, ignore_errors=True)


def barrier(durable_dir: Path, rank: int, world_size: int, attempt: int | None, step: int,
            stop: Callable[[], bool], poll_s: float = 0.002) -> bool:
    """Wait until every rank of the attempt has reached ``step`` (see the module). True
    when all arrived; False when ``stop()`` came first."""
    if world_size <= 1:
        return True
    where = durable_dir / BARRIER / f"attempt-{attempt or 0}"
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".rank-{rank}.{os.getpid()}.tmp"
    tmp.write_text(str(step))  # no fsync: a barrier outlives no crash of the node
    os.replace(tmp, where / f"rank-{rank}")  # whole or not at all

    def arrived(other: int) -> bool:
        try:
            return int((where / f"rank-{other}").read_text() or -1) >= step
        except (OSError, ValueError):
            return False

    waiting = [r for r in range(world_size) if r != rank]
    while waiting:
        waiting = [r for r in waiting if not arrived(r)]
        if waiting and stop():
            return False
        if waiting:
            time.sleep(poll_s)
    return True
