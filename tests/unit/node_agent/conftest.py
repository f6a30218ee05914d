"""Shared helpers: recorded fixtures and a fake command runner for the node agent tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from shared.probes.commands import CommandResult, ToolNotFound

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def fixture_text(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")


class FakeRunner:
    """Answers commands by tool name with recorded output; records every call."""

    def __init__(self, answers: dict[str, CommandResult | Callable[[Sequence[str]], CommandResult]]):
        self.answers = answers
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append((tuple(argv), timeout_s))
        answer = self.answers.get(argv[0])
        if answer is None:
            raise ToolNotFound(f"{argv[0]} not found on PATH")
        return answer(argv) if callable(answer) else answer


def ok(stdout: str, returncode: int = 0, stderr: str = "") -> CommandResult:
    return CommandResult(("fake",), returncode, stdout, stderr)


@pytest.fixture
def sleeper(tmp_path: Path) -> str:
    """An executable that hangs like a wedged GPU tool (and forks, like dcgmi does)."""
    script = tmp_path / "hang.sh"
    script.write_text("#!/bin/sh\nsleep 5 &\nsleep 5\n")
    script.chmod(0o755)
    return str(script)
