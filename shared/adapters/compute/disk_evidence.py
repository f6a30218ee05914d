"""Whether a full disk ended an attempt: the evidence the local and the Slurm adapters read.

The worker launcher (``worker_launcher``) is the one process there when a rank exits: the
moment its command exits non-zero it reads the file systems of the job's directories
(``AIP_CHECKPOINT_DIR``, ``AIP_MODEL_DIR``, ``AIP_TENSORBOARD_LOG_DIR`` at the host's paths,
which a sandboxed job is told as ``gs://`` URIs; the rank's log, the exit file's own) with
``statvfs``, and the end of the rank's log for ``No space left on device``, and leaves
what it saw in ``<exit file>.disk`` (JSON) before the exit file. Read there and then, not
when the adapter next looks: by then the disk may have room again (the soak's fill lasts
seconds; a controller on the same disk cannot commit meanwhile).

The adapter turns that into the exit's ``storage_full`` evidence with the domain's rule
(``shared.domain.storage.full_at``); ``space`` is the ``StorageSpace`` capability both
adapters offer, for the controller's check that room is back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from shared.domain import storage
from shared.domain.exits import PREEMPTED

SUFFIX = ".disk"  # <exit file>.disk: the launcher's readings (worker_launcher.DISK_SUFFIX)


def space(path: str) -> tuple[int, int] | None:
    """``(free, total)`` bytes of the file system holding ``path`` (or its nearest existing
    parent: a job's directory may not exist yet), free as an unprivileged writer sees it."""
    where = Path(path)
    for candidate in (where, *where.parents):
        try:
            st = os.statvfs(candidate)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return None


def readings(exit_file: Path | str) -> tuple[list[storage.Reading], bool]:
    """What the launcher saw when the rank exited: the file systems, and whether its log
    said ENOSPC. Nothing (no file, or not one the launcher wrote) reads as no evidence."""
    try:
        data = json.loads(Path(f"{exit_file}{SUFFIX}").read_text())
        found = [storage.Reading(str(p), int(free), int(total))
                 for p, free, total in data.get("space", [])]
        return found, bool(data.get("enospc"))
    except (OSError, ValueError, TypeError, AttributeError):
        return [], False


def evidence(exit_files: Mapping[int, Path | str], codes: Mapping[int, int | None],
             first_failed: int | None, floor: storage.StorageFloor) -> tuple[str, str]:
    """``(path, note)``: the file system that was full when a rank exited non-zero (the
    rank that failed first is asked first), and the note for the exit's detail (with the
    ``cause=`` token the goodput tally reads); ``("", "")`` when nothing says so."""
    failed = [r for r, c in sorted(codes.items()) if c not in (None, 0, PREEMPTED)]
    if first_failed in failed:
        failed.remove(first_failed)
        failed.insert(0, first_failed)
    for rank in failed:
        if rank not in exit_files:
            continue
        found, enospc = readings(exit_files[rank])
        hit = storage.full_at(found, enospc, floor)
        if hit is not None:
            return hit.path, f"; rank {rank}: {storage.describe(hit)} cause={storage.CAUSE}"
    return "", ""
