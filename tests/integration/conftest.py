"""Everything under tests/integration is an integration test (real services, subprocess
servers, the CLI as a subprocess), marked or not: `make test-fast` leaves it out.

`make test` runs them on two processes (``--dist loadgroup``): the tests that share one
session's Slurm cluster run in one process, those that share the emulators in one, so each
is started once; everything else goes where there is room. Each test keeps to its own free
ports and temporary directories. Tests marked ``alone`` (benchmarks and timing claims that
need the machine to themselves) run afterwards, one at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GROUPS = {HERE / "slurm": "slurm", HERE / "gcp": "emulators"}  # a session fixture each


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # the hook sees the whole session's items: only ours are marked
        path = Path(item.path).resolve()
        if HERE not in path.parents:
            continue
        if item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
        for where, group in GROUPS.items():
            if where in path.parents and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(group))
