"""POST v1beta1/{cluster}:reportFaultyNodes, curl-shaped: an Operation, the node back in
service under its own name; bad bodies a 400 naming the field; audited; editors only."""

from __future__ import annotations

import time
from typing import Any

from services.api.audit import AuditLog
from services.api.auth import REPORT_FAULTY, ROLES
from tests.serving import PARENT
from tests.unit.api.conftest import Api

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"


def _workers(api: Api) -> list[str]:
    nodes = api.call("GET", f"{C}/nodes").json["nodes"]
    return [n["nodeId"] for n in nodes if n["role"] == "worker"]


def _state(api: Api, node: str) -> str:
    nodes = api.call("GET", f"{C}/nodes").json["nodes"]
    return str(next(n["state"] for n in nodes if n["nodeId"] == node))


def _report(api: Api, body: Any) -> Any:
    return api.call("POST", f"{C}:reportFaultyNodes", body)


def _settled(api: Api, op: dict[str, Any]) -> dict[str, Any]:
    for _ in range(400):
        op = api.call("GET", f"/v1beta1/{op['name']}").json
        if op["done"]:
            return op
        api.app.pump(budget_s=0.2)
        time.sleep(0.02)
    raise AssertionError(op)


def test_a_deleted_node_comes_back_under_its_own_name(api: Api) -> None:
    api.cluster(workers=2)
    node = _workers(api)[0]
    resp = _report(api, {"nodeActions": [{"nodeId": node}]})
    assert resp.status_code == 200, resp.json
    op = resp.json
    assert op["name"].startswith(f"{PARENT}/operations/") and op["done"] is False
    assert op["metadata"]["@type"].endswith("ReportFaultyNodesOperationMetadata")
    assert _report(api, {"nodeActions": [{"nodeId": node}]}).json["name"] == op["name"]
    done = _settled(api, op)
    assert "error" not in done, done
    assert _state(api, node) == "idle" and node in _workers(api)
    audit = [r for r in AuditLog(api.app.store, 3600).read()
             if r["resource"].endswith(":reportFaultyNodes")]
    assert [(r["permission"], r["status"]) for r in audit][:1] == [
        ("aiplatform.modelDevelopmentClusters.reportFaultyNodes", 200)]


def test_a_reported_host_repairs_then_returns(api: Api) -> None:
    api.cluster(workers=2)
    node = _workers(api)[1]
    resp = _report(api, {"nodeActions": [{"nodeId": node, "reportFaultyHost": {"faultReasons": [
        {"behavior": "SILENT_DATA_CORRUPTION", "description": "NaNs on rank 3"}]}}]})
    assert resp.status_code == 200, resp.json
    assert _state(api, node) in ("repairing", "draining", "drained")
    done = _settled(api, resp.json)
    assert "error" not in done, done
    assert _state(api, node) == "idle"


def test_bad_bodies_name_the_field(api: Api) -> None:
    api.cluster(workers=2)
    node = _workers(api)[0]
    host = {"faultReasons": [{"behavior": "PERFORMANCE"}]}
    cases = [
        ({}, 400, "nodeActions"),
        ({"nodeActions": []}, 400, "nodeActions"),
        ({"nodeActions": [{}]}, 400, "nodeActions[0].nodeId"),
        ({"nodeActions": [{"nodeId": node, "reportFaultyHost": host},
                          {"nodeId": node + "x", "reportFaultyHost": {
                              "faultReasons": [{"behavior": "SLOW"}]}}]},
         400, "nodeActions[1].reportFaultyHost.faultReasons[0].behavior"),
        ({"nodeActions": [{"nodeId": node, "reportFaultyHost": {"faultReasons": []}}]},
         400, "nodeActions[0].reportFaultyHost.faultReasons"),
        ({"nodeActions": [{"nodeId": node, "extra": 1}]}, 400, "nodeActions[0].extra"),
        ({"nodeActions": [{"nodeId": node}, {"nodeId": node}]}, 400, "nodeActions[1].nodeId"),
        ({"nodeActions": [{"nodeId": node}, {"nodeId": "c1-gpu-999"}]}, 404, "c1-gpu-999"),
    ]
    for body, status, needle in cases:
        resp = _report(api, body)
        assert resp.status_code == status, (body, resp.json)
        assert needle in resp.json["error"]["message"], (body, resp.json)
    assert all(_state(api, n) == "idle" for n in _workers(api))  # nothing was acted on


def test_editors_may_report_viewers_may_not(api: Api) -> None:
    assert REPORT_FAULTY in ROLES["editor"] and REPORT_FAULTY not in ROLES["viewer"]
    api.cluster(workers=1)
    resp = api.call("POST", f"{C}:reportFaultyNodes", {"nodeActions": [{"nodeId": "x"}]},
                    headers={})
    assert resp.status_code == 401
