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


def _state(api: Api, node_id: str) -> str:
    with api.app.deps.uow() as uow:
        node = uow.nodes.get(node_id)
    return "" if node is None else node.state.value


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


def test_a_third_wave_failing_its_deep_checks_rolls_back_through_the_api(api: Api) -> None:
    """The local compute's fault injection plays the bad version on wave 3's node: its deep
    checks fail (DCGM level 3); the Operation ends ABORTED and every node is on its old
    version again."""
    from shared.domain.health import Condition, ConditionStatus, ConditionType

    api.cluster(workers=4)  # the guard lets one of four out: waves of one
    op = api.call("POST", f"{C}:rolloutSoftware", {"version": NEW, "waveSize": 1,
                                                     "canary": 1}).json
    waves = op["metadata"]["mtcRollout"]["waves"]
    assert len(waves) == 4
    third = waves[2]["nodes"][0]
    deadline = time.monotonic() + 60
    while _state(api, third) != "verifying" and time.monotonic() < deadline:
        api.app.pump(budget_s=0.05)  # until its update's reimage is done, its checks not
    assert _state(api, third) == "verifying"
    now = api.app.deps.clock.now()
    api.app.compute.inject_fault(third, [Condition(  # gone with the rollback's reimage
        ConditionType.DCGM_DIAG_FAILED.value, ConditionStatus.TRUE, "dcgmi diag -r 3", now,
        {"level": 3, "failed_tests": ["memory"], "clears_with": "reimage"})])
    done = _settled(api, op)
    assert done["error"]["code"] == 10 and third in done["error"]["message"], done
    rollout = done["metadata"]["mtcRollout"]
    assert rollout["state"] == "ROLLED_BACK" and rollout["pausedWave"] == 3
    assert [w["state"] for w in rollout["waves"]] == ["ROLLED_BACK"] * 3 + ["SKIPPED"]
    with api.app.deps.uow() as uow:
        nodes = [n for n in uow.nodes.list("c1") if n.role.value == "worker"
                 and n.state.value != "retired"]
    assert nodes and all(n.software == {} for n in nodes), [(n.node_id, n.software)
                                                           for n in nodes]
