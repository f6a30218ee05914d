"""Running external tools with a hard timeout, and the errors probes turn into ``unknown``.

GPU tools hang on exactly the hardware we want to diagnose (a GPU off the bus leaves
nvidia-smi or dcgmi stuck), so every command runs with a timeout, in its own process group,
and the whole group is killed on expiry: a plain ``subprocess.run(timeout=...)`` kills only
the direct child and then waits for pipes that a grandchild may hold open forever.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class ProbeError(Exception):
    """A check could not run; ``reason`` is what the ``unknown`` condition says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ToolNotFound(ProbeError):
    pass


class CommandTimedOut(ProbeError):
    def __init__(self, tool: str, timeout_s: float) -> None:
        super().__init__(f"{tool} timed out after {timeout_s:g}s")
        self.tool = tool
        self.timeout_s = timeout_s


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], CommandResult]
"""Runs argv with a timeout in seconds; raises ToolNotFound or CommandTimedOut."""


def resolve_tool(tool: str) -> str:
    """Absolute path of a tool, or ToolNotFound with a reason an operator can act on."""
    if os.sep in tool:
        if os.path.isfile(tool) and os.access(tool, os.X_OK):
            return tool
        raise ToolNotFound(f"{os.path.basename(tool)} not found at {tool}")
    found = shutil.which(tool)
    if found is None:
        raise ToolNotFound(f"{tool} not found on PATH")
    return found


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """Run argv, capture text output, kill its whole process group after ``timeout_s``."""
    if not argv:
        raise ValueError("empty argv")
    tool = os.path.basename(argv[0])
    path = resolve_tool(argv[0])
    try:
        proc = subprocess.Popen(
            [path, *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ToolNotFound(f"{tool} not found on PATH") from exc
    except PermissionError as exc:
        raise ToolNotFound(f"{tool} is not executable: {exc}") from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise CommandTimedOut(tool, timeout_s) from None
    return CommandResult(tuple(argv), proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process group; give up waiting if it is stuck in the kernel (D state)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    # A process in uninterruptible sleep cannot be reaped now; do not hang the agent on it.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=2.0)
