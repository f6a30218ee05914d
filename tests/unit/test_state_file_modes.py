"""The state database and the compute ledger hold every job's environment
and the audit log, so neither may be readable by group or others, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from services.wiring.embedded import embedded


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_defect_7_state_files_are_private_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        state = tmp_path / "state"
        app = embedded(state)
        try:
            with app.transaction() as uow:
                uow.clusters.list()  # the store is written and read at least once
        finally:
            app.close()
    finally:
        os.umask(old)
    assert _mode(state) == 0o700
    files = [p for p in state.rglob("*") if p.is_file() and (
        p.suffix in (".db", ".sqlite3") or p.name.endswith(("-wal", "-shm")))]
    assert {p.name for p in files} >= {"mtc.db", "compute.sqlite3"}, files
    assert {str(p): _mode(p) for p in files} == {str(p): 0o600 for p in files}


def test_an_existing_world_readable_state_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    embedded(state).close()
    os.chmod(state, 0o755)
    os.chmod(state / "mtc.db", 0o644)
    embedded(state).close()
    assert _mode(state) == 0o700 and _mode(state / "mtc.db") == 0o600
