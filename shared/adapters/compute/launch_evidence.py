"""Whether an attempt ended because the platform could not start a rank: the evidence the
local and the Slurm adapters read.

A rank whose command never ran exits 127 or 126 whoever is at fault, so the code cannot
say. The worker launcher knows: exec refusing the command (missing, not executable) is the
job's own failure; a failure in what the launcher does before exec (the sandbox's mounts,
a bind of a directory a repair just wiped, a cgroup, the fork) is the platform's. It leaves
which in ``<exit file>.launch`` (``{"by": "command" | "platform", "reason"}``) before the
exit file, outside the sandbox (a sandboxed job cannot write there).

The adapter turns a platform failure of the rank that ended the attempt into the exit's
``launch_failed`` evidence: the control plane restarts the job without blaming its nodes
or its program (``shared.domain.exits``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from shared.domain.exits import LAUNCH_FAILED, NEVER_STARTED

SUFFIX = ".launch"  # <exit file>.launch (worker_launcher.LAUNCH_SUFFIX)
PLATFORM, COMMAND = "platform", "command"


def fault(exit_file: Path | str) -> tuple[str, str] | None:
    """``(by, reason)`` the launcher left for a rank that did not start; None: it started
    (or the file is not one the launcher wrote)."""
    try:
        data = json.loads(Path(f"{exit_file}{SUFFIX}").read_text())
        by, reason = str(data["by"]), " ".join(str(data.get("reason", "")).split())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return (by, reason) if by in (PLATFORM, COMMAND) else None


def evidence(exit_files: Mapping[int, Path | str], codes: Mapping[int, int | None],
             first_failed: int | None) -> tuple[str, str]:
    """``(reason, note)``: why the platform could not start the rank whose failure ended the
    attempt (``first_failed``, else the lowest rank that failed), and the note for the exit's
    detail (with the ``cause=`` token the goodput tally reads); ``("", "")`` when that rank
    ran, or its command was the job's own failure."""
    failed = [r for r, c in sorted(codes.items()) if c not in (None, 0)]
    rank = first_failed if first_failed in failed else (failed[0] if failed else None)
    if rank is None or codes[rank] not in NEVER_STARTED or rank not in exit_files:
        return "", ""
    found = fault(exit_files[rank])
    if found is None or found[0] != PLATFORM:
        return "", ""
    reason = f"rank {rank} was not started: {found[1]}"
    return reason, f"; {reason} cause={LAUNCH_FAILED}"
