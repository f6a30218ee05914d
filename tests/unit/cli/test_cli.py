"""The CLI's pieces without a control plane: errors, tables, options, tokens."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from services.api.errors import ApiError, FieldViolation
from services.api.tokens import LocalTokens
from services.cli.client import ClientError, operation_parent
from services.cli.commands_api import job_body, job_row, pool_text
from services.cli.main import build_parser, main


def test_a_status_body_and_an_api_error_make_the_same_client_error() -> None:
    exc = ApiError("INVALID_ARGUMENT", "a: bad", [FieldViolation("a", "bad"),
                                                  FieldViolation("b", "worse")])
    local = ClientError.from_status(exc.status_json(), exc.status)
    remote = ClientError.from_status(exc.body()["error"])
    assert local == remote == ClientError("INVALID_ARGUMENT", "a: bad",
                                          [("a", "bad"), ("b", "worse")])
    assert ClientError.from_status({"code": 13, "message": "boom"}).status == "INTERNAL"


def test_operation_names_parse() -> None:
    parent, op_id = operation_parent("projects/p/locations/l/operations/42")
    assert (parent.name, op_id) == ("projects/p/locations/l", "42")
    with pytest.raises(ClientError):
        operation_parent("projects/p/operations/42")


def test_table_cells() -> None:
    assert pool_text({"id": "h100", "scalingSpec": {"minNodeCount": "4", "maxNodeCount": "4"},
                      "mtcHotSpareCount": "1"}) == "h100:4(+1)"
    assert pool_text({"id": "cpu", "scalingSpec": {"minNodeCount": "2"}}) == "cpu:2"
    job = {"name": "projects/p/locations/l/customJobs/123", "state": "JOB_STATE_RUNNING",
           "jobSpec": {"persistentResourceId": "demo"},
           "mtcProgress": {"clusterId": "demo", "attempt": 2, "restartCount": 1,
                           "nodes": ["n1", "n2"], "latestCheckpoint": {"step": "40"}}}
    assert job_row(job) == ["123", "demo", "RUNNING", "2", "1", "n1,n2", "40"]


def test_cluster_option_fills_the_persistent_resource_id(tmp_path: Path) -> None:
    f = tmp_path / "job.json"
    f.write_text(json.dumps({"displayName": "x", "jobSpec": {}}))
    args = argparse.Namespace(file=str(f), cluster="demo")
    assert job_body(args)["jobSpec"]["persistentResourceId"] == "demo"
    f.write_text(json.dumps({"jobSpec": {"persistentResourceId": "other"}}))
    with pytest.raises(ClientError, match="disagrees"):
        job_body(args)


def test_global_options_go_before_or_after_the_command() -> None:
    p = build_parser()
    a = p.parse_args(["job", "list", "--project", "p1", "--json"])
    assert (a.project, a.json, a.location) == ("p1", True, None)
    b = p.parse_args(["--project", "p2", "--location", "l", "cluster", "get", "c"])
    assert (b.project, b.location, b.json) == ("p2", "l", False)


def test_local_state_commands_refuse_a_remote_api(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    for argv in (["node", "fault", "n", "--xid", "79"], ["events"], ["token", "list"],
                 ["controller", "--for", "0"]):
        assert main(["--state-dir", str(tmp_path), "--api", "http://127.0.0.1:9", *argv]) == 2
        assert "local state directory only" in capsys.readouterr().err
    assert not (tmp_path / "mtc.db").exists()


def test_tokens_are_minted_listed_and_revoked(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    state = ["--state-dir", str(tmp_path)]
    assert main([*state, "token", "create", "--role", "editor", "--name", "ci",
                 "--project", "p1"]) == 0
    token = capsys.readouterr().out.strip()
    principal = LocalTokens(tmp_path / "api-tokens.json").authenticate(token)
    assert principal is not None and principal.bindings == (("p1", "editor"),)
    assert main([*state, "--json", "token", "list"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert record["principal"] == "token:ci" and "sha256" not in record
    assert main([*state, "token", "revoke", record["id"]]) == 0
    assert main([*state, "token", "revoke", record["id"]]) == 2
    assert "error: NOT_FOUND:" in capsys.readouterr().err


def test_global_options_are_taken_after_the_command_too(tmp_path: Path) -> None:
    """README writes `mtc serve --port P --state-dir DIR`."""
    parser = build_parser()
    after = parser.parse_args(["serve", "--port", "0", "--state-dir", str(tmp_path)])
    before = parser.parse_args(["--state-dir", str(tmp_path), "serve", "--port", "0"])
    assert after.state_dir == before.state_dir == str(tmp_path)
    listed = parser.parse_args(["job", "list", "--state-dir", str(tmp_path), "--json"])
    assert listed.state_dir == str(tmp_path) and listed.json is True
    assert "--state-dir" in parser._subparsers._group_actions[0].choices["serve"].format_help()
    assert main(["state", "check", "--state-dir", str(tmp_path)]) == 0


def test_local_commands_do_not_offer_api_and_a_url_without_scheme_says_how(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Events, controller, demo and tensorboard advertised --api and then
    refused it; `--api localhost:8080` was a raw InvalidSchema."""
    choices = build_parser()._subparsers._group_actions[0].choices
    for name in ("events", "controller", "demo", "tensorboard"):
        assert "--api URL" not in choices[name].format_help(), name
    assert "--api URL" in choices["job"]._subparsers._group_actions[0].choices["list"].format_help()
    capsys.readouterr()
    assert main(["--state-dir", str(tmp_path), "--api", "localhost:8080", "--token", "t", "job",
                 "list"]) == 2
    err = capsys.readouterr().err
    assert "write it as http://localhost:8080" in err and "InvalidSchema" not in err


def test_an_empty_list_says_where_it_looked_and_ids_are_never_cut(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """An empty list says where it looked, and a long id is never cut in a narrow table."""
    from rich.table import Table

    from services.cli.commands_api import whole_ids

    assert main(["--state-dir", str(tmp_path), "--project", "p", "--location", "l", "job",
                 "list"]) == 0
    assert "none in projects/p/locations/l" in capsys.readouterr().err
    long_id = "7205370512345678901234"
    t = Table("JOB", "CLUSTER", "STATE", "ATTEMPT", "RESTARTS", "NODES", "CHECKPOINT")
    t.add_row(long_id, "c1", "RUNNING", "1", "0", "c1-gpu-0,c1-gpu-1,c1-gpu-2,c1-gpu-3", "120")
    from rich.console import Console
    narrow = Console(width=60, record=True)
    narrow.print(whole_ids(t))
    assert long_id in narrow.export_text()


def test_a_piped_table_keeps_every_cell_whole(capsys: pytest.CaptureFixture[str]) -> None:
    """Off a terminal (``| grep``, a file) rich would lay a table out for 80 columns and cut
    or wrap the names in it: piped, a row is one whole line."""
    from rich.table import Table

    from services.cli.commands_api import show

    names = ["projects/p/locations/us-central1/customJobs/7205370512345678901234",
             "c1-gpu-000,c1-gpu-001,c1-gpu-002,c1-gpu-003,c1-gpu-004,c1-gpu-005"]

    def table() -> Table:
        t = Table("JOB", "STATE", "NODES")
        t.add_row(names[0], "JOB_STATE_RUNNING", names[1])
        return t

    show([{}], False, table)
    lines = capsys.readouterr().out.splitlines()
    assert any(names[0] in line and names[1] in line for line in lines), lines
