"""POST .../nodes/{node}:releaseHold | :drain | :resume | :returnToService: an operator's
commands on a node, each audited (who, what, reason, when) and in the timeline."""

from __future__ import annotations

from typing import Any

from services.api.audit import AuditLog
from tests.serving import PARENT
from tests.unit.api.conftest import Api

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"


def _worker(api: Api) -> str:
    nodes = api.call("GET", f"{C}/nodes").json["nodes"]
    return next(n["nodeId"] for n in nodes if n["role"] == "worker")


def _op(api: Api, node: str, verb: str, body: Any) -> Any:
    return api.call("POST", f"{C}/nodes/{node}:{verb}", body)


def test_operator_drain_and_resume_are_audited(api: Api) -> None:
    api.cluster(workers=2)
    node = _worker(api)
    drained = _op(api, node, "drain", {"reason": "bad fan"})
    assert drained.status_code == 200, drained.json
    assert drained.json["operatorDrained"] is True
    assert drained.json["state"] in ("drained", "draining")
    api.app.pump()
    again = _op(api, node, "drain", {"reason": "bad fan"})  # a retry: same answer
    assert again.status_code == 200 and again.json["operatorDrained"] is True
    resumed = _op(api, node, "resume", {"reason": "fan replaced"})
    assert resumed.status_code == 200, resumed.json
    assert resumed.json["operatorDrained"] is False and resumed.json["state"] == "idle"
    audit = [r for r in AuditLog(api.app.store, 3600).read()
             if ":drain" in r["resource"] or ":resume" in r["resource"]]
    assert [(r["who"], r["permission"], r["resource"].rsplit(":", 1)[-1], r.get("reason"),
             r["status"]) for r in audit] == [
        ("token:env-admin", "aiplatform.modelDevelopmentClusters.update", "drain", "bad fan", 200),
        ("token:env-admin", "aiplatform.modelDevelopmentClusters.update", "drain", "bad fan", 200),
        ("token:env-admin", "aiplatform.modelDevelopmentClusters.update", "resume", "fan replaced",
         200)]
    assert all(r["at"] > 0 for r in audit)


def test_node_commands_refuse_bad_input(api: Api) -> None:
    api.cluster(workers=1)
    node = _worker(api)
    cases = [
        (node, "drain", {}, 400, "reason"),
        (node, "drain", {"reason": ""}, 400, "reason"),
        (node, "drain", {"reason": "x", "extra": 1}, 400, "extra"),
        ("c1-gpu-999", "drain", {"reason": "x"}, 404, "c1-gpu-999"),
        (node, "resume", {"reason": "x"}, 400, "not drained by an operator"),
        (node, "returnToService", {"reason": "x"}, 400, "not FAILED"),
        (node, "releaseHold", {"reason": "x"}, 400, "not held"),
    ]
    for target, verb, body, status, needle in cases:
        resp = _op(api, target, verb, body)
        assert resp.status_code == status, (verb, body, resp.json)
        assert needle in resp.json["error"]["message"], (verb, body, resp.json)
    nodes = api.call("GET", f"{C}/nodes").json["nodes"]
    assert all(n["state"] == "idle" and not n.get("operatorDrained") for n in nodes
               if n["role"] == "worker")


def test_a_held_repair_is_said_where_the_clusters_health_is_shown(api: Api) -> None:
    """A node whose GPU fell off the bus, held by the guard, kept its job
    while the cluster read "READY / all nodes in service"."""
    import time

    from shared.domain.health import Condition, ConditionStatus, ConditionType

    api.cluster(workers=4)
    workers = [n["nodeId"] for n in api.call("GET", f"{C}/nodes").json["nodes"]
               if n["role"] == "worker"]
    for node in workers[:2]:  # the guard allows one of four out at a time
        api.app.compute.inject_fault(node, [Condition(  # type: ignore[attr-defined]
            ConditionType.XID_ERROR.value, ConditionStatus.TRUE, "Xid 79", time.time(),
            {"xids": [79]})])
    for _ in range(100):
        cluster = api.call("GET", C).json
        if cluster["mtcNodes"].get("repairsHeld"):
            break
        api.app.pump(budget_s=0.2)
        time.sleep(0.05)
    assert cluster["mtcNodes"]["repairsHeld"] == 1, cluster
    message = cluster["mtcStateMessage"]
    assert "1 repair held by the blast-radius guard" in message, message
    assert "mtc node release-hold" in message and "--cluster c1" in message
    assert message != "all nodes in service"


def test_a_cluster_with_a_node_out_does_not_read_all_nodes_in_service(api: Api) -> None:
    api.cluster(workers=2)
    assert api.call("GET", C).json["mtcStateMessage"] == "all nodes in service"
    node = _worker(api)
    assert _op(api, node, "drain", {"reason": "bad fan"}).status_code == 200
    api.app.pump()
    message = api.call("GET", C).json["mtcStateMessage"]
    assert message == "1 of 2 nodes in service (1 drained)", message
    assert _op(api, node, "resume", {"reason": "fan replaced"}).status_code == 200
    assert api.call("GET", C).json["mtcStateMessage"] == "all nodes in service"
