"""The official SDK (google-cloud-aiplatform, REST transport), unchanged, against a live
`mtc serve`: Model.upload with a prebuilt PyTorch prediction image, model.deploy with two
replicas on the cluster's nodes, endpoint.predict answering with the model's predictions,
undeploy_all and delete; the replicas' processes are gone after."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions
from google.cloud import aiplatform
from google.oauth2.credentials import Credentials

from shared.service_layer.serving import RUNTIME
from tests.cli_support import clean_env, mtc, mtc_json
from tests.serving import create_cluster, mtc_serve, wait_until

torch = pytest.importorskip("torch")

TOKEN = "endpoint-sdk-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PARENT = "projects/p/locations/us-central1"
IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/pytorch-cpu.2-4:latest"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("endpoints") / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        op = create_cluster(url, TOKEN, "c1", parent=PARENT, workers=3)
        assert "error" not in op, op
        yield url, state


def save_model(directory: Path) -> None:
    """y = 2x + 1, as TorchScript: what the prebuilt PyTorch runtime serves."""
    layer = torch.nn.Linear(1, 1)
    with torch.no_grad():
        layer.weight.fill_(2.0)
        layer.bias.fill_(1.0)
    directory.mkdir(parents=True)
    torch.jit.script(layer).save(str(directory / "model.pt"))


def runtime_processes() -> list[int]:
    """The serving runtime's processes of this checkout (its path is in their command)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(RUNTIME).encode() in cmdline and b"worker_launcher" not in cmdline:
                out.append(int(entry.name))
    return out


def sample(text: str, name: str, labels: set[str]) -> float | None:
    """The value of the series ``name`` with (at least) ``labels`` in a /metrics text."""
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.startswith(name + "{") and labels <= set(head[len(name) + 1:-1].split(",")):
            return float(value)
    return None


def test_upload_deploy_predict_undeploy_delete_through_the_official_sdk(
        server: tuple[str, Path]) -> None:
    url, state = server
    started = time.monotonic()
    save_model(state / "jobs" / "gcs" / "serve-bkt" / "scorer")
    creds: Any = Credentials(token=TOKEN)
    aiplatform.init(project="p", location="us-central1", api_endpoint=url, api_transport="rest",
                    credentials=creds)
    model = aiplatform.Model.upload(display_name="scorer", artifact_uri="gs://serve-bkt/scorer",
                                    serving_container_image_uri=IMAGE)
    endpoint = model.deploy(machine_type="a3-highgpu-8g", min_replica_count=2,
                            max_replica_count=4)
    [deployed] = endpoint.list_models()
    assert deployed.dedicated_resources.min_replica_count == 2
    assert deployed.dedicated_resources.max_replica_count == 4
    assert dict(endpoint.traffic_split) == {deployed.id: 100}

    raw = requests.get(f"{url}/v1/{endpoint.resource_name}", headers=AUTH, timeout=10).json()
    replicas = raw["deployedModels"][0]["mtcReplicas"]
    assert [r["state"] for r in replicas] == ["READY", "READY"], replicas
    assert len({r["node"] for r in replicas}) == 2  # a node serves one replica

    for _ in range(4):  # both replicas take turns
        prediction = endpoint.predict(instances=[[1.0], [2.5]])
        assert prediction.predictions == [[3.0], [6.0]]
        assert prediction.deployed_model_id == deployed.id
        assert prediction.model_version_id == "1"
        assert prediction.model_resource_name == model.resource_name
    with pytest.raises(exceptions.BadRequest):
        endpoint.predict(instances=[["not a number"]])
    endpoint.update(display_name="renamed", labels={"team": "serving"})
    assert (endpoint.display_name, dict(endpoint.labels)) == ("renamed", {"team": "serving"})
    assert dict(endpoint.traffic_split) == {deployed.id: 100}
    assert len(runtime_processes()) == 2
    scraped = requests.get(f"{url}/metrics", headers=AUTH, timeout=10).text
    ours = {f'endpoint="{endpoint.resource_name}"', f'deployed_model="{deployed.id}"'}
    assert sample(scraped, "mtc_endpoint_requests_total", ours | {'code="200"'}) == 4
    assert sample(scraped, "mtc_endpoint_requests_total", ours | {'code="400"'}) == 1
    assert sample(scraped, "mtc_endpoint_replicas", ours | {'state="READY"'}) == 2
    assert sample(scraped, "mtc_endpoint_request_seconds_count", ours) == 5
    shown = requests.get(f"{url}/console/api/endpoints", headers=AUTH, timeout=10).json()
    [row] = [d for e in shown["endpoints"] for d in e["deployedModels"]]
    assert (row["traffic"], row["requests"]) == (100, {"200": 4, "400": 1})
    assert [r["state"] for r in row["replicas"]] == ["READY", "READY"]
    assert row["p50S"] is not None and row["p99S"] >= row["p50S"]

    endpoint.undeploy_all()
    assert endpoint.list_models() == []
    answer = requests.post(f"{url}/v1/{endpoint.resource_name}:predict", headers=AUTH,
                           json={"instances": [[1.0]]}, timeout=10)
    assert answer.status_code == 400 and "no deployed model" in answer.text
    wait_until("the replicas' processes to end", lambda: not runtime_processes(), 20)
    endpoint.delete()
    gone = requests.get(f"{url}/v1/{endpoint.resource_name}", headers=AUTH, timeout=10)
    assert gone.status_code == 404, gone.text
    assert aiplatform.Endpoint.list() == []
    assert time.monotonic() - started < 40


def test_the_cli_deploys_predicts_and_undeploys(server: tuple[str, Path], tmp_path: Path) -> None:
    url, state = server
    save_model(state / "jobs" / "gcs" / "serve-bkt" / "cli")
    up = requests.post(f"{url}/v1/{PARENT}/models:upload", headers=AUTH, timeout=10, json={
        "modelId": "cli-model", "model": {"displayName": "cli", "artifactUri":
                                          "gs://serve-bkt/cli", "containerSpec": {
                                              "imageUri": IMAGE}}})
    assert up.status_code == 200, up.text
    env = clean_env(MTC_API=url, MTC_API_TOKEN=TOKEN, MTC_PROJECT="p",
                    MTC_LOCATION="us-central1")
    cli_state = tmp_path / "unused"
    mtc(cli_state, "endpoint", "create", "--display-name", "cli", "--endpoint-id", "cli-ep",
        env=env)
    mtc(cli_state, "endpoint", "deploy", "cli-ep", "--model", "cli-model", "--machine-type",
        "a3-highgpu-8g", "--wait", "60", env=env)
    shown = mtc(cli_state, "endpoint", "get", "cli-ep", env=env).stdout
    assert "READY" in shown and "cli-model@1" in shown, shown
    out = mtc(cli_state, "endpoint", "predict", "cli-ep", "--instances", "[[1.0], [0.0]]",
              env=env).stdout
    assert json.loads(out) == [[3.0], [1.0]]
    [deployed] = mtc_json(cli_state, "endpoint", "get", "cli-ep", env=env)["deployedModels"]
    name = f"{url}/v1/{PARENT}/endpoints/cli-ep"
    mutated = requests.post(f"{name}:mutateDeployedModel", headers=AUTH, timeout=10, json={
        "deployedModel": {"id": deployed["id"], "dedicatedResources": {
            "machineSpec": {"machineType": "a3-highgpu-8g"}, "minReplicaCount": 2,
            "maxReplicaCount": 2}},
        "updateMask": "dedicatedResources.minReplicaCount,dedicatedResources.maxReplicaCount"})
    assert mutated.status_code == 200 and mutated.json()["done"], mutated.text

    def ready() -> list[str]:
        got = requests.get(name, headers=AUTH, timeout=10).json()["deployedModels"][0]
        states = [r["state"] for r in got["mtcReplicas"]]
        return states if states == ["READY", "READY"] else []

    wait_until("the second replica to be ready", ready, 30)
    mtc(cli_state, "endpoint", "undeploy", "cli-ep", deployed["id"], env=env)
    mtc(cli_state, "endpoint", "delete", "cli-ep", env=env)
    assert mtc_json(cli_state, "endpoint", "list", env=env) == []
