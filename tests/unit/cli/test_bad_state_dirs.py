"""Bad state directories fail clearly (the file named, what to do), and a
blank command is refused when the job is created, not when it runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.api.tokens import LocalTokens
from services.cli.main import main
from shared.domain.errors import StateError, ValidationError
from shared.domain.specs import ContainerSpec


def test_defect_9_a_damaged_token_file_refuses_start_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "api-tokens.json").write_text("{not json", encoding="utf-8")
    os.chmod(tmp_path / "api-tokens.json", 0o600)
    code = main(["--state-dir", str(tmp_path), "serve", "--port", "0", "--for", "0.1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "api-tokens.json is damaged" in err and "mtc token create" in err
    assert "Traceback" not in err


def test_a_token_file_damaged_while_serving_keeps_the_tokens_read_before(tmp_path: Path) -> None:
    path = tmp_path / "api-tokens.json"
    tokens = LocalTokens(path)
    token = tokens.create("token:a", "editor")
    assert tokens.authenticate(token) is not None
    path.write_text('{"tokens": 7}', encoding="utf-8")  # another size: it is re-read
    assert tokens.authenticate(token) is not None
    with pytest.raises(StateError, match=r"api-tokens\.json is damaged"):
        LocalTokens(path).authenticate(token)  # a fresh start refuses it


def test_defect_9_an_unopenable_state_database_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mtc.db").mkdir()  # as unopenable as a read-only directory, even for root
    code = main(["--state-dir", str(tmp_path), "cluster", "list"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"cannot open the state database {tmp_path / 'mtc.db'}" in err
    assert "Traceback" not in err


def test_defect_9_a_blank_command_is_refused_at_create() -> None:
    with pytest.raises(ValidationError) as exc:
        ContainerSpec.parse({"imageUri": "local", "command": [""]}, "jobSpec.workerPoolSpecs[0]"
                            ".containerSpec")
    assert exc.value.path == "jobSpec.workerPoolSpecs[0].containerSpec.command[0]"
