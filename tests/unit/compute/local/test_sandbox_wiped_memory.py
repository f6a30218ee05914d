"""A node's memory (its checkpoint tiers' directories) can be wiped by a repair between the
moment a rank's sandbox is planned and the moment the rank starts: the demo's hot swap
restored from a buddy's peer copy while that buddy rebooted, and the bind of the vanished
directory failed the rank's start (exit 126), charging the job a failure of its own. Those
binds are optional: the rank starts without the directory and finds no copy there."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from shared.adapters.compute import worker_launcher
from shared.adapters.compute.local import sandbox
from shared.sdk.mtc_program import protocol as p

ROOT_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                               reason="the sandbox is for a root server on Linux")


def test_the_tier_directories_are_optional_binds_and_the_jobs_own_are_not(tmp_path: Path
                                                                         ) -> None:
    job = tmp_path / "jobs" / "j" / "checkpoints"
    peer = tmp_path / "state" / "nodes" / "n1" / "shm" / "j" / "peer"
    made = sandbox.plan(
        uid=sandbox.FIRST_UID, gid=sandbox.FIRST_UID, hidden=[str(tmp_path / "state")],
        job_dirs=[str(job)], job_files=[], read_only=[], home=str(tmp_path / "home"),
        env={p.TIER2_SOURCE_DIR: str(peer / "rank-0")}, command=["python"],
        python=sys.executable, output_root=str(tmp_path / "jobs"))
    optional = {b.src: b.optional for b in made.binds}
    assert optional[str(peer)] is True
    assert optional[str(job)] is False
    assert json.loads(made.to_json())["binds"][0][4] in (True, False)  # travels to the launcher


def launch(tmp_path: Path, bind: list[object]) -> int:
    plan = {"uid": sandbox.FIRST_UID, "gid": sandbox.FIRST_UID, "covers": [],
            "home": str(tmp_path), "scratch": [], "limits": {}, "binds": [bind]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    return worker_launcher.main(["--exit-file", str(tmp_path / "rank.exit"),
                                 "--sandbox", str(tmp_path / "plan.json"), "--", "/bin/true"])


@ROOT_ONLY
def test_a_wiped_memory_directory_does_not_stop_the_rank(tmp_path: Path) -> None:
    gone = tmp_path / "shm" / "peer"  # planned, then wiped before the start
    assert launch(tmp_path, [str(gone), str(gone), True, True, True]) == 0
    assert (tmp_path / "rank.exit").read_text() == "0\n"


@ROOT_ONLY
def test_a_missing_directory_of_the_jobs_own_still_fails_the_start(tmp_path: Path) -> None:
    gone = tmp_path / "checkpoints"
    code = launch(tmp_path, [str(gone), str(gone), True, True, False])
    assert code == worker_launcher.EXIT_NOT_EXECUTABLE
    code = launch(tmp_path, [str(gone), str(gone), True, True])  # a plan of the older shape
    assert code == worker_launcher.EXIT_NOT_EXECUTABLE
