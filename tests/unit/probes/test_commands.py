from __future__ import annotations

import time
from pathlib import Path

import pytest

from shared.probes.commands import CommandTimedOut, ToolNotFound, run_command


def test_runs_and_captures() -> None:
    result = run_command(["sh", "-c", "echo out; echo err >&2; exit 3"], 5.0)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")


def test_timeout_kills_the_whole_process_group() -> None:
    # The grandchild keeps the pipe open: killing only the child would hang communicate().
    start = time.monotonic()
    with pytest.raises(CommandTimedOut) as info:
        run_command(["sh", "-c", "sleep 5 & sleep 5"], 0.2)
    assert time.monotonic() - start < 3.0
    assert info.value.reason == "sh timed out after 0.2s"


def test_sleep_5_with_a_short_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(CommandTimedOut):
        run_command(["sleep", "5"], 0.2)
    assert time.monotonic() - start < 2.0


def test_missing_tools() -> None:
    with pytest.raises(ToolNotFound, match=r"^nvidia-smi-xyz not found on PATH$"):
        run_command(["nvidia-smi-xyz", "-q"], 1.0)
    with pytest.raises(ToolNotFound, match=r"^dcgmi not found at /opt/nope/dcgmi$"):
        run_command(["/opt/nope/dcgmi"], 1.0)


def test_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ToolNotFound):
        run_command([str(script)], 1.0)
