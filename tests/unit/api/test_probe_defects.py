"""Regressions from the operator's and attacker's probe of the API, each named after its
defect: they fail on 842929f."""

from __future__ import annotations

from pathlib import Path

from services.api.audit import AnonymousBudget, AuditLog
from services.api.tokens import LocalTokens
from tests.serving import PARENT
from tests.unit.api.conftest import AUTH, Api

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
OPERATOR_VERBS = ("drain", "resume", "releaseHold", "returnToService")


def _worker(api: Api) -> str:
    nodes = api.call("GET", f"{C}/nodes").json["nodes"]
    return next(n["nodeId"] for n in nodes if n["role"] == "worker")


def _audit(api: Api) -> list[dict[str, object]]:
    return AuditLog(api.app.store, 3600).read()


def test_defect_5_deeply_nested_body_on_node_operator_routes_is_400_and_audited(api: Api) -> None:
    api.cluster(workers=1)
    node = _worker(api)
    body = '{"reason": ' + "[" * 2000 + "]" * 2000 + "}"
    for verb in OPERATOR_VERBS:
        resp = api.client.open(f"{C}/nodes/{node}:{verb}", method="POST", data=body,
                               content_type="application/json",
                               headers=AUTH)
        assert resp.status_code == 400, (verb, resp.status_code, resp.json)
        assert "(body)" in resp.json["error"]["message"]
    records = [r for r in _audit(api) if "/nodes/" in str(r["resource"])]
    assert sorted(str(r["resource"]).rsplit(":", 1)[-1] for r in records) == sorted(OPERATOR_VERBS)
    assert {r["status"] for r in records} == {400}


def test_defect_6_denied_calls_leave_audit_records(api: Api, tmp_path: Path) -> None:
    api.cluster(workers=1)
    node = _worker(api)
    viewer = LocalTokens(api.app.state_dir / "api-tokens.json").create("token:vera", "viewer")
    before = len(_audit(api))
    denied = api.call("POST", f"{C}/nodes/{node}:drain", {"reason": "mine now"},
                      headers={"Authorization": f"Bearer {viewer}"})
    assert denied.status_code == 403
    nobody = api.call("POST", f"{C}/nodes/{node}:drain", {"reason": "x"}, headers={})
    assert nobody.status_code == 401
    forged = api.call("POST", f"{C}/nodes/{node}:drain", {"reason": "x"},
                      headers={"Authorization": "Bearer not-a-token"})
    assert forged.status_code == 401
    new = _audit(api)[before:]
    assert [(r["who"], r["status"]) for r in new] == [
        ("token:vera", 403), ("(unauthenticated)", 401), ("(unauthenticated)", 401)]
    assert new[0]["reason"] == "mine now"
    assert all(r["permission"] == "aiplatform.modelDevelopmentClusters.update" for r in new)


def test_an_anonymous_flood_is_audited_a_bounded_number_of_times_a_minute() -> None:
    budget = AnonymousBudget(per_minute=3)
    got = [budget.admit(60.0 + i) for i in range(5)]
    assert got == [0, 0, 0, None, None]
    assert budget.admit(120.0) == 2  # the next minute's first says what was left out
    assert budget.admit(121.0) == 0
