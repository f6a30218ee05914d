"""POST .../nodes/{node}:reportHealth: validated like `mtc node fault`, injected like it."""

from __future__ import annotations

from typing import Any

from tests.serving import PARENT
from tests.unit.api.conftest import Api

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"


def _worker(api: Api) -> str:
    nodes = api.call("GET", f"{C}/nodes").json["nodes"]
    return next(n["nodeId"] for n in nodes if n["role"] == "worker")


def _report(api: Api, node: str, body: Any, **kw: Any) -> Any:
    return api.call("POST", f"{C}/nodes/{node}:reportHealth", body, **kw)


def test_an_xid_report_takes_the_node_out_of_service(api: Api) -> None:
    api.cluster(workers=2)
    node = _worker(api)
    resp = _report(api, node, {"xids": [79]})
    assert resp.status_code == 200, resp.json
    assert resp.json == {"node": f"{C.removeprefix('/v1beta1/')}/nodes/{node}",
                         "conditions": [{"type": "XidError", "reason": "NVRM: Xid [79]"}]}
    api.app.pump()
    with api.app.transaction() as uow:
        got = uow.nodes.get(node)
        assert got is not None and got.state.value not in ("idle", "allocated"), got.state


def test_bad_reports_are_400s_naming_the_field(api: Api) -> None:
    api.cluster(workers=1)
    node = _worker(api)
    cases = [({"xids": [0]}, "xids"), ({"xids": [999]}, "xids"), ({"eccDbe": 0}, "eccDbe"),
             ({"thermalC": 400}, "thermalC"), ({"diskUsedFraction": 5}, "diskUsedFraction"),
             ({"slowRatio": 2}, "slowRatio"), ({"dcgmLevel": 9}, "dcgmLevel"),
             ({"bogus": 1}, "bogus"), ({}, "(body)"), ({"xids": "79"}, "xids")]
    for body, field in cases:
        resp = _report(api, node, body)
        assert resp.status_code == 400, (body, resp.json)
        assert resp.json["error"]["message"].startswith(field), (body, resp.json)


def test_unknown_node_login_node_and_viewer_are_refused(api: Api) -> None:
    api.cluster(workers=1)
    assert _report(api, "nope", {"xids": [79]}).status_code == 404
    login = next(n["nodeId"] for n in api.call("GET", f"{C}/nodes").json["nodes"]
                 if n["role"] == "login")
    resp = _report(api, login, {"xids": [79]})
    assert resp.status_code == 400 and "login" in resp.json["error"]["message"], resp.json
    other = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c2/nodes/x:reportHealth"
    assert api.call("POST", other, {"xids": [79]}).status_code == 404
    assert api.call("POST", f"{C}/nodes/{_worker(api)}:reportHealth", {"xids": [79]},
                    headers={}).status_code == 401
