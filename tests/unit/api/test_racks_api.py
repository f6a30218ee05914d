"""Racks on the embedded default: ``mtcTopology`` on a node pool of the
Vertex-shaped API is carried to the nodes; a scripted rack failure (every node of the job's
rack loses its GPU) drains the rack once and moves the job to another rack."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.api.http import create_app
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from shared.domain.events import DomainDrained
from shared.domain.health import Condition, ConditionStatus, ConditionType
from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import TOKEN, Api, one_pass_config

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
BASE = f"/v1beta1/{PARENT}/modelDevelopmentClusters?modelDevelopmentClusterId="


def racks_body(workers: int = 8, **topology: Any) -> dict[str, Any]:
    body = cluster_body(workers)
    body["nodePools"][1]["mtcTopology"] = topology or {"nodesPerRack": 4}
    return body


@pytest.fixture
def racks_api(tmp_path: Path) -> Iterator[Api]:
    config = one_pass_config()
    config = replace(config, repair=replace(config.repair, domain_drain_fraction=0.5))
    app = embedded(tmp_path / "state", config=config)
    ctx, _ = embedded_api(app, env_token=TOKEN)
    yield Api(create_app(ctx).test_client(), app)
    app.compute.kill_all()
    app.close()


def wait(api: Api, until: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "timed out"
        api.app.pump(budget_s=0.2)
        time.sleep(0.05)


def create(api: Api, body: dict[str, Any]) -> None:
    resp = api.call("POST", BASE + "c1", body)
    assert resp.status_code == 200, resp.json
    wait(api, lambda: api.call("GET", C).json.get("state") == "READY")


def nodes(api: Api) -> list[dict[str, Any]]:
    return [n for n in api.call("GET", f"{C}/nodes").json["nodes"] if n["role"] == "worker"]


def test_bad_topologies_are_400s_naming_the_wire_field(racks_api: Api) -> None:
    cases: list[tuple[dict[str, Any], str]] = [({"nodesPerRack": 0}, "nodePools[1].mtcTopology.nodesPerRack"),
             ({"racksPerSwitch": 2}, "nodePools[1].mtcTopology.nodesPerRack"),
             ({"nodesPerRack": 4, "spareLayout": "perRow"}, "nodePools[1].mtcTopology.spareLayout"),
             ({"nodes": [{"rack": "r1"}]}, "nodePools[1].mtcTopology.nodes")]
    for topology, field in cases:
        resp = racks_api.call("POST", BASE + "c9", racks_body(**topology))
        assert resp.status_code == 400, (topology, resp.json)
        fields = [v["field"] for d in resp.json["error"]["details"]
                  for v in d.get("fieldViolations", [])]
        assert fields[:1] == [field], (topology, resp.json)
    assert racks_api.call("GET", f"/v1beta1/{PARENT}/modelDevelopmentClusters/c9"
                          ).status_code == 404  # nothing changed


@pytest.mark.slow
def test_a_rack_failure_on_the_embedded_default_drains_the_rack_once_and_moves_the_job(
        racks_api: Api) -> None:
    api = racks_api
    drained: list[DomainDrained] = []
    api.app.bus.listeners.append(
        lambda env, _: drained.append(env.event) if isinstance(env.event, DomainDrained)
        else None)
    create(api, racks_body(8))
    assert sorted({n["rack"] for n in nodes(api)}) == ["gpu-rack-0", "gpu-rack-1"]
    def pool(replicas: str) -> dict[str, Any]:
        return {"machineSpec": {"machineType": "a3-highgpu-8g",
                                "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
                "replicaCount": replicas, "containerSpec": {
                    "imageUri": "local",
                    "command": [sys.executable, "-c", "import time; time.sleep(120)"]}}

    job = {"displayName": "j",
           "jobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": [pool("1"), pool("2")]}}
    resp = api.call("POST", f"/v1/{PARENT}/customJobs", job)
    assert resp.status_code == 200, resp.json
    jobs = f"/v1/{resp.json['name']}"

    def placed() -> list[str]:
        return [n["nodeId"] for n in nodes(api) if n.get("job")]

    wait(api, lambda: api.call("GET", jobs).json["state"] == "JOB_STATE_RUNNING"
         and len(placed()) == 3)
    by_id = {n["nodeId"]: n for n in nodes(api)}
    rack = by_id[placed()[0]]["rack"]
    assert {by_id[n]["rack"] for n in placed()} == {rack}  # packed into one rack
    members = sorted(n for n, v in by_id.items() if v["rack"] == rack)
    for node in members:  # the rack's power shelf: every node's GPUs fall off the bus
        api.app.compute.inject_fault(node, [Condition(
            ConditionType.XID_ERROR.value, ConditionStatus.TRUE, "Xid 79", time.time(),
            {"xids": [79]})])

    def moved() -> bool:
        on = placed()
        return (api.call("GET", jobs).json["state"] == "JOB_STATE_RUNNING" and len(on) == 3
                and not set(on) & set(members))

    wait(api, moved, timeout_s=60.0)
    assert [(e.domain, e.held) for e in drained] == [(rack, False)]
    assert all(by["state"] not in ("idle", "allocated") or by["nodeId"] not in members
               for by in nodes(api))
    assert len({by_id[n]["rack"] for n in placed()}) == 1
