"""Everything under tests/integration is an integration test (real services, subprocess
servers, the CLI as a subprocess), marked or not: `make test-fast` leaves it out."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # the hook sees the whole session's items: only ours are marked
        if HERE in Path(item.path).resolve().parents and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
