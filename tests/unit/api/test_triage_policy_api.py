"""``.../modelDevelopmentClusters/{c}/triagePolicy`` and its commands: a candidate triage
table in shadow on live traffic (the diff by cause in the answer and in ``/metrics``), then a
recommendation accepted through the API, each command audited with its reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.api.audit import AuditLog
from services.api.http import create_app
from services.observability.http import Observability, add_routes
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.candidates import CAUSE, rollout
from tests.serving import PARENT
from tests.unit.api.conftest import TOKEN, Api, one_pass_config

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
P = f"{C}/triagePolicy"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Api]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    flask_app = create_app(ctx)
    add_routes(flask_app, Observability(app.store, app.deps.clock, ctx.guard,
                                        event_log=app.deps.event_log))
    yield Api(flask_app.test_client(), app)
    app.compute.kill_all()
    app.close()


def _workers(api: Api) -> list[str]:
    return [n["nodeId"] for n in api.call("GET", f"{C}/nodes").json["nodes"]
            if n["role"] == "worker"]


def _xid13(api: Api, node: str) -> None:
    resp = api.call("POST", f"{C}/nodes/{node}:reportHealth", {"xids": [13]})
    assert resp.status_code == 200, resp.json
    api.app.pump()


def _configure(api: Api, body: dict[str, Any]) -> Any:
    return api.call("POST", f"{P}:configure", body)


def test_shadow_then_recommend_through_the_api(served: Api) -> None:
    api = served
    api.cluster(workers=2)
    first, second = _workers(api)
    empty = {"evaluated": 0, "differing": 0, "dropped": 0, "causes": [], "rows": []}
    assert api.call("GET", P).json == {"policy": None, "recommendations": [], "diff": empty,
                                       "repairDiff": empty}
    resp = _configure(api, {**rollout(), "reason": "try the stricter XID 13 row"})
    assert resp.status_code == 200, resp.json
    assert resp.json["policy"]["by"] == "token:env-admin"
    _xid13(api, first)
    got = api.call("GET", P).json
    assert got["diff"]["causes"] == [CAUSE] and got["diff"]["rows"][0]["nodes"] == [first]
    metrics = api.call("GET", "/metrics").get_data(as_text=True)
    assert (f'mtc_triage_shadow_differences{{active_action="restart_job",'
            f'candidate_action="reset_gpu",cause="{CAUSE}",cluster="c1"}} 1.0') in metrics

    stages = {"stages": [{"stage": "recommend", "cause": CAUSE}]}
    assert _configure(api, {**rollout(), **stages, "reason": "ask me"}).status_code == 200
    _xid13(api, second)
    [rec] = api.call("GET", P).json["recommendations"]
    assert rec["verdict"] == "pending" and rec["nodeId"] == second
    assert "mtc_triage_recommendations_pending{cluster=\"c1\"} 1.0" in api.call(
        "GET", "/metrics").get_data(as_text=True)
    resp = api.call("POST", f"{P}:accept", {"recommendation": rec["id"], "reason": "agreed"})
    assert resp.status_code == 200, resp.json
    assert resp.json["recommendations"][0]["verdict"] == "accepted"
    api.app.pump()
    assert api.call("GET", P).json["diff"]["differing"] == 2  # same candidate: one report
    audit = [(r["resource"].rsplit(":", 1)[-1], r.get("reason"), r["status"])
             for r in AuditLog(api.app.store, 3600).read() if "triagePolicy" in r["resource"]]
    assert audit == [("configure", "try the stricter XID 13 row", 200),
                     ("configure", "ask me", 200), ("accept", "agreed", 200)]


def test_bad_commands_are_refused_naming_the_field(served: Api) -> None:
    api = served
    api.cluster(workers=1)
    broken = rollout()
    broken["xid"] = {}
    bad_row = rollout()
    bad_row["candidate"]["xid"]["rules"][0]["action"] = "explode"
    cases = [
        ("configure", rollout(), 400, "reason"),
        ("configure", {**bad_row, "reason": "x"}, 400, "candidate.xid.rules[0].action"),
        ("configure", {**rollout({"stage": "live"}), "reason": "x"}, 400, "stages[0].stage"),
        ("configure", {**broken, "reason": "x"}, 400, "xid"),
        ("accept", {"recommendation": "nope", "reason": "x"}, 404, "nope"),
        ("dismiss", {"recommendation": "nope"}, 400, "reason"),
        ("dismiss", {"recommendation": "a/b", "reason": "x"}, 400, "recommendation"),
    ]
    for verb, body, status, needle in cases:
        resp = api.call("POST", f"{P}:{verb}", body)
        assert resp.status_code == status, (verb, resp.json)
        assert needle in resp.json["error"]["message"], (verb, resp.json)
    other = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c9/triagePolicy"
    assert api.call("GET", other).status_code == 404
    assert api.call("GET", P, headers={}).status_code == 401
    assert _configure(api, {**rollout(), "reason": "x"}).status_code == 200
    cleared = api.call("POST", f"{P}:clear", {"reason": "done with it"})
    assert cleared.status_code == 200 and cleared.json["policy"] is None
