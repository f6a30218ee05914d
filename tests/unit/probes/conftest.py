"""Fixtures for the probe tests (the fake runner and recorded outputs are in ``fakes`` and
``tests.recorded``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def sleeper(tmp_path: Path) -> str:
    """An executable that hangs like a wedged GPU tool (and forks, like dcgmi does)."""
    script = tmp_path / "hang.sh"
    script.write_text("#!/bin/sh\nsleep 5 &\nsleep 5\n")
    script.chmod(0o755)
    return str(script)
