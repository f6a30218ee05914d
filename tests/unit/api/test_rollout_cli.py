"""`mtc cluster rollout CLUSTER --driver V [--wave-size N --canary N --wait S]`: in process
on the local state and through --api (HTTP); it prints the waves and their states."""

from __future__ import annotations

from typing import Any

import pytest

from services.cli.client import HttpClient, LocalClient
from services.cli.commands_api import cmd_cluster, rollout_body
from services.cli.main import build_parser
from tests.unit.api.conftest import Api
from tests.unit.api.test_report_faulty_cli import FlaskSession, api_parent


def _args(*argv: str) -> Any:
    return build_parser().parse_args(["cluster", "rollout", *argv])


def test_the_body_names_only_what_was_given() -> None:
    args = _args("c1", "--driver", "560.35", "--wave-size", "4", "--canary", "2")
    assert rollout_body(args) == {"version": {"driver": "560.35"}, "waveSize": 4,
                                  "canary": 2}


@pytest.mark.parametrize("remote", [False, True])
def test_a_rollout_from_the_cli_shows_its_waves(api: Api, remote: bool,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    api.cluster(workers=2)
    client: Any = HttpClient("http://mtc.test", "t", session=FlaskSession(api))  # type: ignore[arg-type]
    if not remote:
        client = LocalClient(api.app)
    args = _args("c1", "--node-image", "img-2", "--wave-size", "1")
    args.parent = api_parent()
    cmd_cluster(args, client)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("rollout c1.1 (nodeImage img-2): RUNNING, wave 1 of 2"), out
    assert out[1].startswith("  wave 1: RUNNING") and out[2].startswith("  wave 2: PENDING")
