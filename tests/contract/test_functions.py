"""Each service through functions-framework's own test client: structured and binary
CloudEvents, Pub/Sub push envelopes, malformed events, and the Vertex AI REST API."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from cloudevents.conversion import to_binary, to_structured
from flask.testing import FlaskClient
from functions_framework import create_app
from werkzeug.test import TestResponse

from services.job_submission import commands as job_commands
from services.wiring import runtime as rt_mod
from shared.codec import to_cloudevent, to_pubsub
from shared.domain.events import NodeHealthReported
from shared.domain.model import NodeState
from tests.harness import CLUSTER, Plane, xid
from tests.serving import vertex_pools

ROOT = Path(__file__).resolve().parents[2]


class PlaneRuntime:
    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.deps = plane.deps
        self.store = plane.store  # what cloud_api keeps its records and audit in

    def after_request(self) -> None:
        self.plane.deliver()


@pytest.fixture
def plane() -> Iterator[Plane]:
    p = Plane()
    p.api(job_commands.create_cluster, CLUSTER)
    p.deliver()
    p.bring_up()
    rt_mod.install(PlaneRuntime(p))
    yield p
    rt_mod.install(None)


def client(target: str, kind: str = "cloudevent") -> FlaskClient:
    """The entry point ``target`` of the root main.py, as Cloud Functions serves it."""
    app = create_app(target, str(ROOT / "main.py"), kind)  # type: ignore[no-untyped-call]
    return cast(FlaskClient, app.test_client())


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


# ---------------------------------------------------------------- HTTP API (Vertex AI REST)
#
# The functions-framework ``api`` target over a Plane. A PlaneRuntime is not the embedded
# runtime, so api_context() builds the Google Cloud context (cloud_api): Google ID tokens,
# plus MTC_API_TOKEN as an admin bearer token. The context is cached per installed runtime,
# so each fixture sets the variable *before* installing a fresh runtime.

PARENT = "projects/p1/locations/us-central1"
CLUSTERS = f"/v1beta1/{PARENT}/modelDevelopmentClusters"
JOBS = f"/v1/{PARENT}/customJobs"
OPERATION_TYPES = "type.googleapis.com/google.cloud.aiplatform.v1beta1."
GPU = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
       "acceleratorCount": 8}


def new_token() -> str:
    return f"contract-{secrets.token_hex(16)}"  # no dots: never taken for a Google JWT


def cluster_body(display: str = "contract", gpu_nodes: int = 4, spares: int = 1
                 ) -> dict[str, Any]:
    return {
        "displayName": display,
        "nodePools": [
            {"id": "login", "machineSpec": {"machineType": "n2-standard-8"},
             "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1}},
            {"id": "gpu", "machineSpec": dict(GPU),
             "scalingSpec": {"minNodeCount": gpu_nodes, "maxNodeCount": gpu_nodes},
             "mtcHotSpareCount": spares},
        ],
        "orchestratorSpec": {"slurmSpec": {"partitions": [{"id": "gpu", "nodePoolIds": ["gpu"]}],
                                           "loginNodePoolId": "login"}},
    }


def custom_job(cluster: str = "c1", replicas: str = "2", display: str = "train"
               ) -> dict[str, Any]:
    return {
        "displayName": display,
        "jobSpec": {
            "persistentResourceId": cluster,
            "workerPoolSpecs": vertex_pools({
                "machineSpec": dict(GPU),
                "containerSpec": {"imageUri": "local", "command": ["python3", "train.py"],
                                  "args": ["--steps", "10"],
                                  "env": [{"name": "SEED", "value": "7"}]},
            }, replicas),
            "scheduling": {"timeout": "600s", "mtcPartition": "gpu"},
        },
    }


def js(resp: TestResponse) -> Any:
    """The response's JSON body (every answer of the API has one)."""
    assert resp.is_json, resp.data
    return resp.json


class Api:
    """The ``api`` function's test client, sending ``Authorization: Bearer <token>``."""

    def __init__(self, token: str | None) -> None:
        self.client = client("api", "http")
        self.headers = {"Authorization": f"Bearer {token}"} if token is not None else {}

    def call(self, method: str, path: str, body: Any = None, *, data: str | None = None
             ) -> TestResponse:
        if data is not None:
            return self.client.open(path, method=method, data=data, headers=self.headers,
                                    content_type="application/json")
        return self.client.open(path, method=method, json=body, headers=self.headers)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        resp = self.call(method, path, body)
        assert resp.status_code == 200, (method, path, resp.status_code, resp.json)
        return resp.json

    def wait(self, operation: dict[str, Any], timeout: str = "5s") -> Any:
        return self.ok("POST", f"/v1beta1/{operation['name']}:wait", {"timeout": timeout})


@dataclass
class Vertex:
    plane: Plane
    api: Api
    token: str


@pytest.fixture
def vertex(monkeypatch: pytest.MonkeyPatch) -> Iterator[Vertex]:
    """A Plane with cluster c1 created through the API (4 GPU nodes, 1 a hot spare), up."""
    token = new_token()
    monkeypatch.setenv("MTC_API_TOKEN", token)
    p = Plane()
    rt_mod.install(PlaneRuntime(p))
    api_ = Api(token)
    op = api_.ok("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c1", cluster_body())
    p.bring_up()
    assert api_.wait(op)["done"] is True
    yield Vertex(p, api_, token)
    rt_mod.install(None)


def test_api_cluster_create_returns_an_operation_that_wait_finishes(vertex: Vertex) -> None:
    api_, plane = vertex.api, vertex.plane
    op = api_.ok("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c2", cluster_body("second", 2, 0))
    assert set(op) >= {"name", "metadata", "done"} and op["done"] is False
    assert op["name"].startswith(f"{PARENT}/operations/")
    assert op["metadata"]["@type"] == (
        f"{OPERATION_TYPES}CreateModelDevelopmentClusterOperationMetadata")
    assert api_.wait(op, "0.1s")["done"] is False  # no machine is up yet
    assert api_.ok("GET", f"/v1beta1/{op['name']}")["done"] is False
    plane.bring_up()
    done = api_.wait(op)
    assert done["done"] is True and "error" not in done, done
    assert done["response"]["name"] == f"{PARENT}/modelDevelopmentClusters/c2"
    assert done["response"]["state"] == "READY"
    got = api_.ok("GET", f"{CLUSTERS}/c2")
    assert got["displayName"] == "second" and got["state"] == "READY"
    assert [p["id"] for p in got["nodePools"]] == ["login", "gpu"]
    assert got["mtcNodes"]["total"] == 2 and got["mtcNodes"]["inService"] == 2


def test_api_cluster_list_pages_with_page_size_and_token(vertex: Vertex) -> None:
    api_ = vertex.api
    api_.ok("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c2", cluster_body("second", 1, 0))
    first = api_.ok("GET", f"{CLUSTERS}?pageSize=1")
    assert [c["name"].rsplit("/", 1)[1] for c in first["modelDevelopmentClusters"]] == ["c1"]
    assert first["nextPageToken"]
    second = api_.ok("GET", f"{CLUSTERS}?pageSize=1&pageToken={first['nextPageToken']}")
    assert [c["name"].rsplit("/", 1)[1] for c in second["modelDevelopmentClusters"]] == ["c2"]
    assert not second.get("nextPageToken")
    everything = api_.ok("GET", CLUSTERS)["modelDevelopmentClusters"]
    assert [c["displayName"] for c in everything] == ["contract", "second"]


def test_api_cluster_create_retried_is_the_same_operation_and_another_body_conflicts(
        vertex: Vertex) -> None:
    api_ = vertex.api
    again = api_.ok("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c1", cluster_body())
    assert again["done"] is True
    other = api_.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c1",
                      cluster_body("renamed"))
    assert other.status_code == 409 and js(other)["error"]["status"] == "ALREADY_EXISTS"
    assert api_.ok("GET", f"{CLUSTERS}/c1")["displayName"] == "contract"


def test_api_cluster_nodes_list_like_sinfo(vertex: Vertex) -> None:
    nodes = vertex.api.ok("GET", f"{CLUSTERS}/c1/nodes")["nodes"]
    workers = [n for n in nodes if n["role"] == "worker"]
    assert len(workers) == 4
    assert {n["partition"] for n in workers} == {"gpu"}
    assert {n["state"] for n in workers} == {"idle"}
    assert sum(bool(n.get("spare")) for n in workers) == 1
    assert all(n["name"] == f"{PARENT}/modelDevelopmentClusters/c1/nodes/{n['nodeId']}"
               for n in nodes)
    page = vertex.api.ok("GET", f"{CLUSTERS}/c1/nodes?pageSize=2")
    assert len(page["nodes"]) == 2 and page["nextPageToken"]


def test_api_custom_job_create_get_list_cancel_delete(vertex: Vertex) -> None:
    api_, plane = vertex.api, vertex.plane
    job = api_.ok("POST", f"{JOBS}?customJobId=j9", custom_job())
    assert job["name"] == f"{PARENT}/customJobs/j9"
    assert [p["replicaCount"] for p in job["jobSpec"]["workerPoolSpecs"]] == ["1", "1"]
    assert job["jobSpec"]["scheduling"] == {"timeout": "600s", "mtcPartition": "gpu"}
    got = api_.ok("GET", f"{JOBS}/j9")
    assert got["state"] == "JOB_STATE_RUNNING"
    progress = got["mtcProgress"]
    assert progress["clusterId"] == "c1" and progress["attempt"] == 1
    assert progress["restartCount"] == 0 and len(progress["nodes"]) == 2
    busy = {n["nodeId"]: n.get("job") for n in api_.ok("GET", f"{CLUSTERS}/c1/nodes")["nodes"]}
    assert all(busy[n] == "j9" for n in progress["nodes"])
    assert [j["name"] for j in api_.ok("GET", JOBS)["customJobs"]] == [job["name"]]

    running = api_.call("DELETE", f"{JOBS}/j9")  # Vertex refuses: cancel first
    assert running.status_code == 400 and js(running)["error"]["status"] == "FAILED_PRECONDITION"
    assert api_.ok("POST", f"{JOBS}/j9:cancel") == {}
    assert api_.ok("GET", f"{JOBS}/j9")["state"] == "JOB_STATE_CANCELLING"
    plane.exit_workers(plane.job("j9").job_id, 1, 143)
    plane.deliver()
    cancelled = api_.ok("GET", f"{JOBS}/j9")
    assert cancelled["state"] == "JOB_STATE_CANCELLED" and cancelled["error"]["code"] == 1
    op = api_.ok("DELETE", f"{JOBS}/j9")
    assert op["done"] is True and op["name"].startswith(f"{PARENT}/operations/")
    assert api_.call("GET", f"{JOBS}/j9").status_code == 404
    assert api_.ok("GET", JOBS).get("customJobs", []) == []


def test_api_missing_job_is_a_google_rpc_not_found(vertex: Vertex) -> None:
    resp = vertex.api.call("GET", f"{JOBS}/missing")
    assert resp.status_code == 404
    assert js(resp)["error"]["status"] == "NOT_FOUND"
    assert js(resp)["error"]["code"] == 404
    assert f"{PARENT}/customJobs/missing" in js(resp)["error"]["message"]


@pytest.mark.parametrize("token", [None, "not-the-token"])
@pytest.mark.parametrize(("method", "path"), [("GET", JOBS), ("GET", f"{CLUSTERS}/c1"),
                                              ("POST", f"{JOBS}?customJobId=j1")])
def test_api_without_the_token_is_unauthenticated(vertex: Vertex, token: str | None,
                                                  method: str, path: str) -> None:
    resp = Api(token).call(method, path, custom_job() if method == "POST" else None)
    assert resp.status_code == 401
    assert js(resp)["error"]["status"] == "UNAUTHENTICATED"
    assert vertex.plane.job("j1") is None


def test_api_token_is_read_when_a_runtime_gets_its_context(vertex: Vertex,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The context is cached per runtime: a new MTC_API_TOKEN counts once a runtime is
    installed (as a new function instance would start), and the old token stops working."""
    assert vertex.api.call("GET", JOBS).status_code == 200
    rotated = new_token()
    monkeypatch.setenv("MTC_API_TOKEN", rotated)
    rt_mod.install(PlaneRuntime(vertex.plane))
    assert Api(rotated).call("GET", JOBS).status_code == 200
    assert vertex.api.call("GET", JOBS).status_code == 401


def test_api_misspelled_field_is_a_400_naming_it(vertex: Vertex) -> None:
    body = custom_job()
    pool = body["jobSpec"]["workerPoolSpecs"][0]
    pool["replicaCont"] = pool.pop("replicaCount")
    resp = vertex.api.call("POST", f"{JOBS}?customJobId=j2", body)
    assert resp.status_code == 400
    error = js(resp)["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["details"][0]["@type"] == "type.googleapis.com/google.rpc.BadRequest"
    assert error["details"][0]["fieldViolations"][0]["field"] == (
        "jobSpec.workerPoolSpecs[0].replicaCont")
    assert vertex.plane.job("j2") is None


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda b: b["nodePools"][1].update(mtcHotSpareCount=-1), "nodePools[1].mtcHotSpareCount"),
    (lambda b: b["nodePools"][1]["machineSpec"].pop("acceleratorType"),
     "nodePools[1].machineSpec.acceleratorType"),
    (lambda b: b["nodePools"][1]["scalingSpec"].update(maxNodeCount=8),
     "nodePools[1].scalingSpec.maxNodeCount"),
])
def test_api_bad_cluster_is_a_400_naming_the_wire_field(vertex: Vertex, mutate: Any,
                                                        field: str) -> None:
    body = cluster_body()
    mutate(body)
    resp = vertex.api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c3", body)
    assert resp.status_code == 400, resp.json
    assert js(resp)["error"]["details"][0]["fieldViolations"][0]["field"] == field
    assert vertex.api.call("GET", f"{CLUSTERS}/c3").status_code == 404


def test_api_job_no_pool_can_run_is_refused(vertex: Vertex) -> None:
    body = custom_job()
    body["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] = {**GPU, "acceleratorCount": 4}
    resp = vertex.api.call("POST", f"{JOBS}?customJobId=j3", body)
    assert resp.status_code == 400
    violation = js(resp)["error"]["details"][0]["fieldViolations"][0]
    assert violation["field"].startswith("jobSpec.workerPoolSpecs[0].machineSpec"), violation
    assert vertex.api.ok("GET", JOBS).get("customJobs", []) == []


def test_api_bad_json_and_wrong_method(vertex: Vertex) -> None:
    api_ = vertex.api
    bad = api_.call("POST", f"{JOBS}?customJobId=j4", data="{nope")
    assert bad.status_code == 400 and js(bad)["error"]["status"] == "INVALID_ARGUMENT"
    assert js(bad)["error"]["details"][0]["fieldViolations"][0]["field"] == "(body)"
    put = api_.call("PUT", JOBS, {})
    assert put.status_code == 405 and "POST" in js(put)["error"]["message"]
    assert api_.call("PUT", CLUSTERS, {}).status_code == 405
    assert api_.call("GET", f"/v1/{PARENT}/nothingHere").status_code == 404


def test_api_job_create_retried_is_the_same_job_and_another_body_is_refused(
        vertex: Vertex) -> None:
    api_ = vertex.api
    first = api_.ok("POST", f"{JOBS}?customJobId=j5", custom_job())
    again = api_.ok("POST", f"{JOBS}?customJobId=j5", custom_job())
    assert again["name"] == first["name"] and again["createTime"] == first["createTime"]
    assert len(vertex.plane.compute.started) == 2  # the workers were started once
    other = api_.call("POST", f"{JOBS}?customJobId=j5", custom_job(display="other"))
    assert 400 <= other.status_code < 500, other.json
    assert api_.ok("GET", f"{JOBS}/j5")["displayName"] == "train"
    assert len(api_.ok("GET", JOBS)["customJobs"]) == 1
