"""Whose failure a rank that never started is: what the launcher leaves beside its exit file
(``worker_launcher``) and what the adapters make of it (``launch_evidence``)."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

from shared.adapters.compute import launch_evidence, worker_launcher
from shared.adapters.compute.local import sandbox
from shared.domain.exits import LAUNCH_FAILED


def leave(exit_file: Path, by: str, reason: str = "cannot start 'x': boom") -> None:
    Path(f"{exit_file}{launch_evidence.SUFFIX}").write_text(json.dumps({"by": by, "reason": reason}))


def test_exec_refusing_the_command_is_the_commands_and_the_rest_the_platforms() -> None:
    cmd = ["/no/such/train"]
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", cmd[0])
    denied = PermissionError(errno.EACCES, "Permission denied", cmd[0])
    assert worker_launcher.launch_fault(missing, cmd)["by"] == "command"
    assert worker_launcher.launch_fault(denied, cmd)["by"] == "command"
    preexec = subprocess.SubprocessError("Exception occurred in preexec_fn.")
    ours = FileNotFoundError(errno.ENOENT, "No such file or directory", "/run/j/rank-0.exit.msg")
    fork = BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    for exc in (preexec, ours, fork):
        assert worker_launcher.launch_fault(exc, cmd)["by"] == "platform", exc


def test_the_launcher_leaves_whose_failure_it_was(tmp_path: Path) -> None:
    exit_file = tmp_path / "rank-0.exit"
    code = worker_launcher.run(str(exit_file), ["no-such-program-xyz"])
    assert code == worker_launcher.EXIT_NOT_FOUND
    assert launch_evidence.fault(exit_file) == (
        "command", "cannot start 'no-such-program-xyz': [Errno 2] No such file or directory: "
        "'no-such-program-xyz'")
    # a sandbox that cannot be set up (a bind of the job's own directory that is gone; not
    # root: the job's file cannot be given to its uid): the platform's, and the code kept
    plan = {"uid": sandbox.FIRST_UID, "gid": sandbox.FIRST_UID, "covers": [],
            "home": str(tmp_path), "scratch": [], "limits": {},
            "binds": [[str(tmp_path / "gone"), str(tmp_path / "gone"), True, True, False]]}
    code = worker_launcher.run(str(exit_file), ["/bin/true"], sandbox=plan)
    assert code == worker_launcher.EXIT_NOT_EXECUTABLE
    found = launch_evidence.fault(exit_file)
    assert found is not None and found[0] == launch_evidence.PLATFORM
    assert worker_launcher.run(str(exit_file), ["/bin/true"]) == 0
    assert launch_evidence.fault(exit_file) is None  # a start clears the last one's word


def test_the_rank_that_ended_the_attempt_decides(tmp_path: Path) -> None:
    files = {r: tmp_path / f"rank-{r}.exit" for r in range(3)}
    leave(files[1], "platform", "cannot start 'python': mount /shm/n2 on /shm/n2: gone")
    reason, note = launch_evidence.evidence(files, {0: 143, 1: 126, 2: 75}, 1)
    assert reason == "rank 1 was not started: cannot start 'python': mount /shm/n2 on /shm/n2: gone"
    assert note.endswith(f" cause={LAUNCH_FAILED}")
    # no first failure known: the lowest failed rank's word
    assert launch_evidence.evidence(files, {0: 0, 1: 126, 2: 0}, None)[0] == reason
    # another rank failed first, on its own: no excuse
    assert launch_evidence.evidence(files, {0: 1, 1: 126, 2: 143}, 0) == ("", "")


def test_the_commands_own_failure_or_no_word_is_no_evidence(tmp_path: Path) -> None:
    files = {r: tmp_path / f"rank-{r}.exit" for r in range(2)}
    leave(files[0], "command")
    assert launch_evidence.evidence(files, {0: 127, 1: 143}, 0) == ("", "")
    assert launch_evidence.evidence(files, {0: 143, 1: 126}, 1) == ("", "")  # no file
    Path(f"{files[1]}{launch_evidence.SUFFIX}").write_text("not json")
    assert launch_evidence.evidence(files, {0: 143, 1: 126}, 1) == ("", "")
    leave(files[1], "platform")
    assert launch_evidence.evidence(files, {0: 143, 1: 1}, 1) == ("", "")  # it ran
