"""The official SDK (google-cloud-aiplatform, REST transport), unchanged, against a live
`mtc serve`: Model.upload with a prebuilt PyTorch prediction image, model.deploy with two
replicas on the cluster's nodes, endpoint.predict answering with the model's predictions,
undeploy_all and delete; the replicas' processes are gone after."""

from __future__ import annotations

import json
import sys
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


SILENT_AFTER_4S = """
import http.server, json, os, time
start, first = time.monotonic(), os.environ["MTC_JOB_ATTEMPT"] == "1"
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == os.environ["AIP_HEALTH_ROUTE"]
        self.send_response(200 if ok and not (first and time.monotonic() - start > 4) else 503)
        self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        out = json.dumps({"predictions": [len(str(i)) for i in body["instances"]]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["AIP_HTTP_PORT"])), Handler)
server.serve_forever()
"""


def test_a_replica_whose_health_route_goes_silent_is_restarted_through_triage(
        server: tuple[str, Path], tmp_path: Path) -> None:
    """A custom container's own command (it reads the contract's variables); its first
    attempt stops answering its health route after 4 s: reported as a hang of its job on
    its node, the job restarts, the next attempt serves."""
    url, _ = server
    program = tmp_path / "silent_server.py"
    program.write_text(SILENT_AFTER_4S)
    up = requests.post(f"{url}/v1/{PARENT}/models:upload", headers=AUTH, timeout=10, json={
        "modelId": "silent", "model": {"displayName": "silent", "containerSpec": {
            "imageUri": "local", "command": [sys.executable, str(program)]}}})
    assert up.status_code == 200, up.text
    made = requests.post(f"{url}/v1/{PARENT}/endpoints", params={"endpointId": "heal"},
                         headers=AUTH, timeout=10, json={"displayName": "heal"})
    assert made.status_code == 200, made.text
    name = f"{url}/v1/{PARENT}/endpoints/heal"
    deployed = requests.post(f"{name}:deployModel", headers=AUTH, timeout=10, json={
        "deployedModel": {"model": f"{PARENT}/models/silent", "dedicatedResources": {
            "machineSpec": {"machineType": "a3-highgpu-8g"}, "minReplicaCount": 1}}})
    assert deployed.status_code == 200, deployed.text

    def replica() -> dict[str, Any]:
        got = requests.get(name, headers=AUTH, timeout=10).json()
        return got["deployedModels"][0]["mtcReplicas"][0]  # type: ignore[no-any-return]

    wait_until("the first attempt to answer", lambda: replica()["state"] == "READY", 20)
    wait_until("the replica's second attempt to serve",
               lambda: replica()["attempt"] >= 2 and replica()["state"] == "READY", 40)
    answer = requests.post(f"{name}:predict", headers=AUTH, timeout=10,
                           json={"instances": ["abc", [1, 2]]})
    assert answer.status_code == 200 and answer.json()["predictions"] == [3, 6], answer.text
    dm = requests.get(name, headers=AUTH, timeout=10).json()["deployedModels"][0]["id"]
    requests.post(f"{name}:undeployModel", headers=AUTH, timeout=10,
                  json={"deployedModelId": dm}).raise_for_status()
    requests.delete(name, headers=AUTH, timeout=10).raise_for_status()
