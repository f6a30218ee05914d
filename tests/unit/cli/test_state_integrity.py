"""A damaged state is checked before it is used. An emptied, corrupted or
truncated ``mtc.db`` refuses start with the file named and the recovery commands; `mtc state
backup` (online) and `mtc state restore` bring the fleet back."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from services.cli.main import main
from services.wiring.embedded import embedded
from shared.domain.errors import StateError
from tests.serving import cluster_body
from tests.unit.api.conftest import one_pass_config

pytestmark = pytest.mark.slow  # real clusters on the local compute, a few seconds each


def _used_state(state: Path) -> None:
    """A state that ran a fleet: a cluster provisioned, nodes in the compute ledger."""
    spec = state.parent / "cluster.json"
    spec.write_text(json.dumps(cluster_body(workers=2)), encoding="utf-8")
    assert main(["--state-dir", str(state), "cluster", "create", "c1", "-f", str(spec),
                 "--wait", "20"]) == 0
    app = embedded(state, config=one_pass_config())
    try:
        app.run(until=lambda: False, timeout_s=1.0)
    finally:
        app.compute.kill_all()
        app.close()


def _damage(db: Path, how: str) -> None:
    data = db.read_bytes()
    if how == "emptied":
        db.write_bytes(b"")
    elif how == "random bytes":
        third = len(data) // 3
        db.write_bytes(data[:third] + os.urandom(4096) + data[third + 4096:])
    else:  # truncated to half
        db.write_bytes(data[: len(data) // 2])
    for suffix in ("-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["emptied", "random bytes", "truncated"])
def test_defect_2_a_damaged_state_database_refuses_start_naming_it(
        tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    _used_state(state)
    _checkpoint(state / "mtc.db")
    _damage(state / "mtc.db", how)
    capsys.readouterr()
    code = main(["--state-dir", str(state), "serve", "--port", "0", "--for", "0.1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(state / "mtc.db") in err and "state restore" in err, err
    assert "Traceback" not in err
    assert main(["--state-dir", str(state), "state", "check"]) == 2
    with pytest.raises(StateError):
        embedded(state, verify=True)


def _checkpoint(db: Path) -> None:
    """Fold the WAL into the file, so damaging the file damages the data."""
    import sqlite3
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def test_backup_and_restore_bring_the_fleet_back(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    state, saved = tmp_path / "state", tmp_path / "saved"
    _used_state(state)
    assert main(["--state-dir", str(state), "state", "backup", str(saved)]) == 0
    assert main(["--state-dir", str(state), "state", "check"]) == 0
    _damage(state / "mtc.db", "emptied")
    assert main(["--state-dir", str(state), "state", "check"]) == 2
    assert main(["--state-dir", str(state), "state", "restore", str(saved)]) == 0
    capsys.readouterr()
    assert main(["--state-dir", str(state), "--json", "state", "check"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["--state-dir", str(state), "--json", "cluster", "list"]) == 0
    assert "c1" in capsys.readouterr().out
    assert (state / "mtc.db.damaged").exists()
