"""A fake command runner for the probes (and the node agent that runs them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shared.probes.commands import CommandResult, ToolNotFound


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
