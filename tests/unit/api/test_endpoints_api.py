"""Endpoints through the Flask app: the resource's create, get, list, patch and delete;
deployModel's refusals as 400s naming the field; a deployed model whose replica never
answers its health route (503 with Retry-After, the Operation not done), undeployed (its
replica's job cancelled, predict a FAILED_PRECONDITION), and the endpoint deleted."""

from __future__ import annotations

import sys
from typing import Any

from tests.serving import PARENT
from tests.unit.api.conftest import Api
from tests.unit.api.test_vertex_surface import violation

ENDPOINTS = f"/v1/{PARENT}/endpoints"
PREBUILT = "us-docker.pkg.dev/vertex-ai/prediction/pytorch-cpu.2-4:latest"
H100 = {"machineType": "a3-highgpu-8g"}


def endpoint(api: Api, endpoint_id: str = "ep") -> dict[str, Any]:
    resp = api.call("POST", f"{ENDPOINTS}?endpointId={endpoint_id}", {"displayName": "e"})
    assert resp.status_code == 200, resp.json
    assert resp.json["done"] and resp.json["response"]["name"].endswith(f"/{endpoint_id}")
    return resp.json["response"]  # type: ignore[no-any-return]


def model(api: Api, model_id: str, container: dict[str, Any]) -> str:
    resp = api.call("POST", f"/v1/{PARENT}/models:upload", {
        "modelId": model_id, "model": {"displayName": model_id, "containerSpec": container}})
    assert resp.status_code == 200, resp.json
    return f"{PARENT}/models/{model_id}"


def deploy(api: Api, name: str, **resources: Any) -> Any:
    body = {"deployedModel": {"model": name, "dedicatedResources": {
        "machineSpec": H100, "minReplicaCount": 1, **resources}}}
    return api.call("POST", f"{ENDPOINTS}/ep:deployModel", body)


def test_create_get_list_patch_delete(api: Api) -> None:
    made = endpoint(api)
    assert made["displayName"] == "e" and made["trafficSplit"] == {}
    assert api.call("GET", f"{ENDPOINTS}/ep").json["name"] == made["name"]
    assert [e["name"] for e in api.call("GET", ENDPOINTS).json["endpoints"]] == [made["name"]]
    patched = api.call("PATCH", f"{ENDPOINTS}/ep?updateMask=display_name,labels",
                       {"displayName": "renamed", "labels": {"team": "a"}})
    assert (patched.json["displayName"], patched.json["labels"]) == ("renamed", {"team": "a"})
    assert violation(api.call("PATCH", f"{ENDPOINTS}/ep?updateMask=network", {})) == "updateMask"
    assert violation(api.call("PATCH", f"{ENDPOINTS}/ep?updateMask=trafficSplit",
                              {"trafficSplit": {"nope": 100}})) == "trafficSplit"
    assert api.call("DELETE", f"{ENDPOINTS}/ep").json["done"]
    assert api.call("GET", f"{ENDPOINTS}/ep").status_code == 404


def test_deploy_refusals_name_the_field(api: Api) -> None:
    api.cluster()
    endpoint(api)
    runnable = model(api, "m1", {"imageUri": PREBUILT})
    imaged = model(api, "m2", {"imageUri": "us-docker.pkg.dev/me/my-server:1"})
    no_resources = api.call("POST", f"{ENDPOINTS}/ep:deployModel",
                            {"deployedModel": {"model": runnable}})
    assert violation(no_resources) == "deployedModel.dedicatedResources"
    assert violation(deploy(api, f"{PARENT}/models/none")) == "deployedModel.model"
    assert violation(deploy(api, imaged)) == "deployedModel.model"
    assert violation(deploy(api, runnable, maxReplicaCount=1, minReplicaCount=3)) == \
        "deployedModel.dedicatedResources.maxReplicaCount"
    other = api.call("POST", f"{ENDPOINTS}/ep:deployModel", {"deployedModel": {
        "model": runnable, "dedicatedResources": {"machineSpec": {"machineType": "n1-tiny"}}}})
    assert violation(other) == "deployedModel.dedicatedResources.machineSpec"
    assert api.call("GET", f"{ENDPOINTS}/ep").json.get("deployedModels", []) == []


def test_a_replica_that_never_answers_is_503_with_retry_after_until_undeployed(api: Api
                                                                               ) -> None:
    api.cluster()
    endpoint(api)
    silent = model(api, "silent", {"imageUri": "local", "command": [
        sys.executable, "-c", "import time; time.sleep(60)"]})
    resp = deploy(api, silent)
    assert resp.status_code == 200, resp.json
    assert resp.json["done"] is False  # finished only once its replica answers
    got = api.call("GET", f"{ENDPOINTS}/ep").json
    [deployed] = got["deployedModels"]
    assert got["trafficSplit"] == {deployed["id"]: 100}
    assert [r["state"] for r in deployed["mtcReplicas"]] == ["STARTING"]
    assert api.call("GET", f"/v1/{resp.json['name']}").json["done"] is False

    busy = api.call("POST", f"{ENDPOINTS}/ep:predict", {"instances": [[1]]})
    assert busy.status_code == 503 and busy.headers["Retry-After"] == "2", busy.json
    assert busy.json["error"]["status"] == "UNAVAILABLE"
    refused = api.call("DELETE", f"{ENDPOINTS}/ep")
    assert refused.json["error"]["status"] == "FAILED_PRECONDITION"

    undeployed = api.call("POST", f"{ENDPOINTS}/ep:undeployModel",
                          {"deployedModelId": deployed["id"]})
    assert undeployed.json["done"], undeployed.json
    with api.app.uow() as uow:
        job = uow.jobs.get(deployed["mtcReplicas"][0]["replica"])
    assert job is not None and job.state.value in ("JOB_STATE_CANCELLING",
                                                   "JOB_STATE_CANCELLED")
    gone = api.call("POST", f"{ENDPOINTS}/ep:predict", {"instances": [[1]]})
    assert gone.status_code == 400 and gone.json["error"]["status"] == "FAILED_PRECONDITION"
    deploy_op = api.call("GET", f"/v1/{resp.json['name']}").json
    assert deploy_op["done"] and deploy_op["error"]["code"] == 10  # undeployed first
    assert api.call("DELETE", f"{ENDPOINTS}/ep").json["done"]
