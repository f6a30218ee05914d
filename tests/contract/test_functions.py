"""Each service through functions-framework's own test client: structured and binary
CloudEvents, Pub/Sub push envelopes, malformed events, and the HTTP API."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary, to_structured
from flask.testing import FlaskClient
from functions_framework import create_app

from services.job_submission import handlers as api
from services.wiring import functions as rt_mod
from shared.codec import to_cloudevent, to_pubsub
from shared.domain.events import NodeHealthReported
from shared.domain.model import NodeState
from tests.harness import CLUSTER, Plane, job_body, xid

ROOT = Path(__file__).resolve().parents[2]


class PlaneRuntime:
    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.deps = plane.deps

    def after_request(self) -> None:
        self.plane.deliver()


@pytest.fixture
def plane() -> Iterator[Plane]:
    p = Plane()
    p.api(api.create_cluster, CLUSTER)
    p.deliver()
    p.bring_up()
    rt_mod.install(PlaneRuntime(p))
    yield p
    rt_mod.install(None)


def client(service: str, target: str = "handle", kind: str = "cloudevent") -> FlaskClient:
    app = create_app(target, str(ROOT / "services" / service / "main.py"), kind)
    return app.test_client()


def report_envelope(plane: Plane, node: str) -> Any:
    env = plane.report(node, xid(79, plane.clock.now()))
    plane.bus.outbox.mark_published([env.id])  # deliver it over HTTP instead of the bus
    return env


@pytest.mark.parametrize("mode", ["structured", "binary"])
def test_health_triage_accepts_both_http_modes(plane: Plane, mode: str) -> None:
    env = report_envelope(plane, "c1-gpu-001")
    headers, body = (to_structured if mode == "structured" else to_binary)(to_cloudevent(env))
    resp = client("health_triage").post("/", headers=headers, data=body)
    assert resp.status_code == 200, resp.data
    plane.deliver()
    assert plane.node("c1-gpu-001").state is NodeState.REPAIRING


def test_pubsub_push_envelope_is_unwrapped(plane: Plane) -> None:
    env = report_envelope(plane, "c1-gpu-002")
    data, attributes = to_pubsub(env)
    push = {"message": {"data": base64.b64encode(data).decode(), "attributes": attributes,
                        "messageId": "1"}, "subscription": "projects/p/subscriptions/s"}
    headers = {"ce-specversion": "1.0", "ce-type": "google.cloud.pubsub.topic.v1.messagePublished",
               "ce-source": "//pubsub.googleapis.com/projects/p/topics/node", "ce-id": "m1",
               "Content-Type": "application/json"}
    resp = client("health_triage").post("/", headers=headers, data=json.dumps(push))
    assert resp.status_code == 200, resp.data
    plane.deliver()
    assert plane.node("c1-gpu-002").state is NodeState.REPAIRING


def test_duplicate_delivery_over_http_is_a_no_op(plane: Plane) -> None:
    env = report_envelope(plane, "c1-gpu-001")
    headers, body = to_binary(to_cloudevent(env))
    c = client("health_triage")
    assert c.post("/", headers=headers, data=body).status_code == 200
    plane.deliver()
    repairs = list(plane.compute.repairs)
    assert c.post("/", headers=headers, data=body).status_code == 200
    plane.deliver()
    assert plane.compute.repairs == repairs


def test_malformed_event_is_dead_lettered_and_acknowledged(plane: Plane) -> None:
    headers = {"ce-specversion": "1.0", "ce-type": NodeHealthReported.TYPE, "ce-source": "//t",
               "ce-id": "bad-1", "Content-Type": "application/json"}
    resp = client("health_triage").post("/", headers=headers,
                                        data=json.dumps({"node_id": "c1-gpu-001"}))
    assert resp.status_code == 200
    dead = plane.deps.dead_letters.list()  # type: ignore[attr-defined]
    assert any("observed_at" in d["reason"] and d["service"] == "health_triage" for d in dead)
    assert plane.node("c1-gpu-001").state is NodeState.IDLE


def test_unknown_node_is_dead_lettered(plane: Plane) -> None:
    env = plane.report("nope", xid(79, plane.clock.now()))
    plane.bus.outbox.mark_published([env.id])
    headers, body = to_binary(to_cloudevent(env))
    assert client("health_triage").post("/", headers=headers, data=body).status_code == 200
    dead = plane.deps.dead_letters.list()  # type: ignore[attr-defined]
    assert any("node nope not found" in d["reason"] for d in dead)


@pytest.mark.parametrize("service", ["provisioning", "repair", "checkpoint_resume",
                                     "job_submission"])
def test_every_service_serves_cloudevents(plane: Plane, service: str) -> None:
    env = report_envelope(plane, "c1-gpu-003")  # a type most services ignore
    headers, body = to_binary(to_cloudevent(env))
    assert client(service).post("/", headers=headers, data=body).status_code == 200


# ---------------------------------------------------------------- HTTP API


def api_client() -> FlaskClient:
    return client("job_submission", "api", "http")


def test_api_cluster_lifecycle_and_jobs(plane: Plane) -> None:
    c = api_client()
    spec = {**CLUSTER, "clusterId": "c2"}
    resp = c.post("/v1/clusters", json=spec)
    assert resp.status_code == 201 and resp.json["state"] == "PROVISIONING"
    assert c.get("/v1/clusters/c2").json["clusterId"] == "c2"
    assert {x["clusterId"] for x in c.get("/v1/clusters").json["clusters"]} == {"c1", "c2"}
    resp = c.post("/v1/clusters/c1/customJobs?customJobId=j9", json=job_body(2))
    assert resp.status_code == 201, resp.json
    assert c.get("/v1/customJobs/j9").json["state"] == "JOB_STATE_RUNNING"
    assert c.post("/v1/customJobs/j9:cancel").json["state"] == "JOB_STATE_CANCELLING"
    nodes = c.get("/v1/clusters/c1/nodes").json["nodes"]
    assert len(nodes) == 5
    assert c.delete("/v1/clusters/c2").status_code == 202


@pytest.mark.parametrize(("body", "field"), [
    ({"clusterId": "Bad_Id", "nodePools": []}, "clusterId"),
    ({"clusterId": "c3", "nodePools": [{"id": "p", "nodeCount": -1,
                                        "machineSpec": {"machineType": "m"}}]},
     "nodePools[0].nodeCount"),
    ({"clusterId": "c3", "nodePools": [{"id": "p", "nodeCount": 1,
                                        "machineSpec": {"machineType": "m",
                                                        "acceleratorCount": 8}}]},
     "nodePools[0].machineSpec.acceleratorType"),
])
def test_api_rejects_bad_cluster_specs_naming_the_field(plane: Plane, body: Any,
                                                        field: str) -> None:
    resp = api_client().post("/v1/clusters", json=body)
    assert resp.status_code == 400
    assert resp.json["error"]["field"] == field
    assert api_client().get("/v1/clusters/c3").status_code == 404


def test_api_rejects_a_job_no_pool_can_run(plane: Plane) -> None:
    body = job_body(2)
    body["jobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorCount"] = 4
    resp = api_client().post("/v1/clusters/c1/customJobs", json=body)
    assert resp.status_code == 400
    assert resp.json["error"]["field"] == "jobSpec.workerPoolSpecs[0].machineSpec"
    assert api_client().get("/v1/clusters/c1/customJobs").json["customJobs"] == []


def test_api_errors_are_json(plane: Plane) -> None:
    c = api_client()
    assert c.post("/v1/clusters", data="{nope").status_code == 400
    assert c.get("/v1/customJobs/missing").status_code == 404
    assert c.put("/v1/clusters").status_code == 405
    assert c.post("/v1/clusters", json=CLUSTER).status_code == 201  # same spec: idempotent
    other = {**CLUSTER, "displayName": "other"}
    assert c.post("/v1/clusters", json=other).status_code == 409
