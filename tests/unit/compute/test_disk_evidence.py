"""The full-disk evidence of a rank's exit: what the launcher reads and leaves, and what the
adapters make of it (``disk_evidence``, ``worker_launcher``)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.adapters.compute import disk_evidence, worker_launcher
from shared.domain.storage import MIB, StorageFloor

PY = sys.executable
EVERYTHING_IS_FULL = StorageFloor(min_free_bytes=1 << 62, min_free_fraction=0.999)


def leave(exit_file: Path, space: list[list[object]], enospc: bool = False) -> None:
    Path(f"{exit_file}{disk_evidence.SUFFIX}").write_text(
        json.dumps({"space": space, "enospc": enospc, "at": 0.0}))


def test_the_rank_that_failed_first_is_asked_first(tmp_path: Path) -> None:
    files = {r: tmp_path / f"rank-{r}.exit" for r in range(3)}
    leave(files[0], [["/roomy", 500 * MIB, 1 << 40]])
    leave(files[2], [["/full", 0, 8 * MIB]])
    path, note = disk_evidence.evidence(files, {0: 143, 1: 0, 2: 1}, 2, StorageFloor())
    assert path == "/full"
    assert "rank 2: disk full at /full (0 B free of 8.0 MiB)" in note
    assert "cause=storage_full" in note


def test_no_readings_or_room_is_no_evidence(tmp_path: Path) -> None:
    files = {r: tmp_path / f"rank-{r}.exit" for r in range(2)}
    leave(files[0], [["/roomy", 500 << 30, 1 << 40]], enospc=True)  # half of it free
    Path(f"{files[1]}{disk_evidence.SUFFIX}").write_text("not json")
    assert disk_evidence.evidence(files, {0: 1, 1: 1}, 0, StorageFloor()) == ("", "")
    # a clean exit or a preemption says nothing of a failure, whatever its readings
    leave(files[1], [["/full", 0, 8 * MIB]])
    assert disk_evidence.evidence(files, {0: 0, 1: 75}, None, StorageFloor()) == ("", "")


def test_space_reads_the_nearest_existing_parent(tmp_path: Path) -> None:
    found = disk_evidence.space(str(tmp_path / "not" / "yet"))
    assert found is not None and 0 <= found[0] <= found[1] and found[1] > 0


def test_a_write_refused_for_want_of_space_is_tried_again() -> None:
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        if len(tries) < 3:
            raise OSError(errno.ENOSPC, "No space left on device")

    worker_launcher.patiently(write, patience_s=10.0)
    assert len(tries) == 3

    def denied() -> None:
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):  # anything else is raised at once
        worker_launcher.patiently(denied, patience_s=10.0)


@pytest.mark.slow  # the launcher and its command as real processes
@pytest.mark.parametrize("code", [0, 75, 1])
def test_the_launcher_reads_the_jobs_disks_at_a_failure(tmp_path: Path, code: int) -> None:
    exit_file, checkpoints = tmp_path / "run" / "rank-0.exit", tmp_path / "out" / "checkpoints"
    log = tmp_path / "rank-0.log"
    program = f"print('OSError: [Errno 28] No space left on device'); raise SystemExit({code})"
    with log.open("w") as out:
        done = subprocess.run(
            [PY, str(worker_launcher.__file__), "--exit-file", str(exit_file), "--", PY, "-c",
             program], stdout=out, stderr=subprocess.STDOUT, timeout=20,
            env={**os.environ, "AIP_CHECKPOINT_DIR": str(checkpoints)})
    assert done.returncode == code and exit_file.read_text() == f"{code}\n"
    found, enospc = disk_evidence.readings(exit_file)
    if code in (0, 75):  # no failure: nothing read
        assert (found, enospc) == ([], False)
        return
    assert enospc  # the end of its log said so
    assert found and found[0].path == str(checkpoints) and found[0].total > 0
    # one reading per file system (here the log, the exit file and the job share one)
    assert len({r.path for r in found}) == len(found) == 1
    path, _ = disk_evidence.evidence({0: exit_file}, {0: code}, 0, EVERYTHING_IS_FULL)
    assert path == str(checkpoints)
