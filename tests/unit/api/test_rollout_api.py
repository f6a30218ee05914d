"""POST v1beta1/{cluster}:rolloutSoftware, curl-shaped: an Operation whose metadata shows the
waves, finished once every node runs the new version; bad bodies a 400 naming the field; a second
version while one runs refused; audited."""

from __future__ import annotations

import time
from typing import Any

from services.api.audit import AuditLog
from tests.serving import PARENT
from tests.unit.api.conftest import Api

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
NEW = {"nodeImage": "mtc-node-2026-12", "driver": "560.35"}


def _settled(api: Api, op: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        op = api.call("GET", f"/v1beta1/{op['name']}").json
        if op["done"]:
            return op
        api.app.pump(budget_s=0.2)
        time.sleep(0.02)
    raise AssertionError(op)


def test_a_rollout_is_an_operation_that_shows_its_waves_and_finishes(api: Api) -> None:
    api.cluster(workers=2)
    resp = api.call("POST", f"{C}:rolloutSoftware", {"version": NEW, "waveSize": 1,
                                                       "canary": 1})
    assert resp.status_code == 200, resp.json
    op = resp.json
    assert op["name"].startswith(f"{PARENT}/operations/") and op["done"] is False
    meta = op["metadata"]
    assert meta["@type"].endswith("RolloutSoftwareOperationMetadata")
    rollout = meta["mtcRollout"]
    assert rollout["state"] == "RUNNING" and rollout["version"] == NEW
    assert [len(w["nodes"]) for w in rollout["waves"]] == [1, 1]
    assert [w["state"] for w in rollout["waves"]] == ["RUNNING", "PENDING"]
    # the same request again (a retry) answers the same Operation; another version is refused
    again = api.call("POST", f"{C}:rolloutSoftware", {"version": NEW, "waveSize": 1,
                                                        "canary": 1})
    assert again.json["name"] == op["name"]
    other = api.call("POST", f"{C}:rolloutSoftware", {"version": {"driver": "999"}})
    assert other.status_code == 400 and other.json["error"]["status"] == "FAILED_PRECONDITION"
    done = _settled(api, op)
    assert "error" not in done, done
    assert done["response"]["@type"].endswith("ModelDevelopmentCluster")
    assert [w["state"] for w in done["metadata"]["mtcRollout"]["waves"]] == ["DONE", "DONE"]
    audit = [r for r in AuditLog(api.app.store, 3600).read()
             if r["resource"].endswith(":rolloutSoftware")]
    assert audit and audit[0]["permission"] == "aiplatform.modelDevelopmentClusters.update"


def test_bad_bodies_name_the_field(api: Api) -> None:
    api.cluster(workers=2)
    for body, field in (({}, "version"), ({"version": {"kernel": "6"}}, "version.kernel"),
                        ({"version": NEW, "waveSize": -1}, "waveSize"),
                        ({"version": NEW, "canary": "x"}, "canary")):
        resp = api.call("POST", f"{C}:rolloutSoftware", body)
        assert resp.status_code == 400, (body, resp.json)
        assert field in str(resp.json), (body, resp.json)
    missing = api.call("POST", f"/v1beta1/{PARENT}/modelDevelopmentClusters/nope"
                       ":rolloutSoftware", {"version": NEW})
    assert missing.status_code == 404
