"""`mtc cluster report-faulty CLUSTER NODE... [--host --behavior B --description D]`: one
call for several nodes, in process on the local state and through --api (HTTP)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from services.api.audit import AuditLog
from services.cli.client import HttpClient, LocalClient
from services.cli.commands_api import cmd_cluster, faulty_body
from services.cli.main import build_parser
from tests.serving import PARENT
from tests.unit.api.conftest import AUTH, Api
from tests.unit.api.test_report_faulty_nodes_api import _state, _workers


class FlaskSession:
    """A ``requests.Session`` stand-in that sends the HttpClient's requests to the app."""

    def __init__(self, api: Api) -> None:
        self.api, self.headers = api, dict[str, str]()

    def request(self, method: str, url: str, *, json: Any = None, params: Any = None,
                timeout: float = 0.0) -> Any:
        path = url.removeprefix("http://mtc.test")
        resp = self.api.client.open(path, method=method, json=json, query_string=params,
                                    headers=AUTH)
        return SimpleNamespace(content=resp.data, json=lambda: resp.json, ok=resp.status_code
                               < 400, status_code=resp.status_code, url=url, text="")


def _args(*argv: str) -> Any:
    return build_parser().parse_args(["cluster", "report-faulty", *argv])


def test_the_body_is_the_documented_one() -> None:
    assert faulty_body(["a", "b"], False, "PERFORMANCE", "") == {
        "nodeActions": [{"nodeId": "a"}, {"nodeId": "b"}]}
    assert faulty_body(["a"], True, "PERFORMANCE", "slow") == {"nodeActions": [{
        "nodeId": "a", "reportFaultyHost": {"faultReasons": [
            {"behavior": "PERFORMANCE", "description": "slow"}]}}]}
    with pytest.raises(SystemExit):
        _args("c1", "n1", "--host", "--behavior", "SLOW")


@pytest.mark.parametrize("remote", [False, True])
def test_report_faulty_acts_on_several_nodes(api: Api, remote: bool,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    api.cluster(workers=3)
    nodes = _workers(api)[:2]
    client: Any = HttpClient("http://mtc.test", "t", session=FlaskSession(api))  # type: ignore[arg-type]
    if not remote:
        client = LocalClient(api.app)
    args = _args("c1", *nodes, "--host", "--behavior", "UNRECOVERABLE_GPU_ERROR",
                 "--description", "Xid 79", "--json")
    args.parent = api_parent()
    cmd_cluster(args, client)
    op = json.loads(capsys.readouterr().out)
    assert op["name"].startswith(f"{PARENT}/operations/"), op
    assert all(_state(api, n) != "idle" for n in nodes)  # both taken out by one call
    audit = [r for r in AuditLog(api.app.store, 3600).read()
             if r["resource"].endswith("c1:reportFaultyNodes")]
    assert len(audit) == 1 and audit[0]["status"] == 200, audit


def api_parent() -> Any:
    from services.api.names import parent

    project, location = PARENT.split("/")[1], PARENT.split("/")[3]
    return parent(project, location)
