"""Client-chosen ids live in their parent's namespace (services.api.ids).

Project A (the first to create anything: its ids are the domain's unchanged) and project B
both have a cluster ``ca``, a model ``m1`` and a job ``j1``; each works fully and neither
sees, names or affects the other.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.api import ids
from services.api.http import create_app
from services.api.names import Parent
from services.console.app import register
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.serving import cluster_body, vertex_pools
from tests.unit.api.conftest import AUTH, TOKEN, Api, one_pass_config

A, B = "projects/pa/locations/l", "projects/pb/locations/l"


def _model(parent: str) -> dict[str, Any]:
    """A model in the project's own bucket (a bucket belongs to one project)."""
    return {"displayName": "m", "artifactUri": f"gs://{parent.split('/')[1]}-b/model"}


def _create_cluster(api: Api, parent: str, cluster_id: str, **kw: Any) -> Any:
    return api.call("POST", f"/v1beta1/{parent}/modelDevelopmentClusters"
                    f"?modelDevelopmentClusterId={cluster_id}", cluster_body(**kw))



def _job(cluster_id: str) -> dict[str, Any]:
    return {"displayName": "echo", "jobSpec": {"persistentResourceId": cluster_id,
                                               "workerPoolSpecs": vertex_pools({
        "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                        "acceleratorCount": 8},
        "containerSpec": {"imageUri": "local", "command": [sys.executable, "-c", "pass"]}},
        1)}}


def _nodes(api: Api, parent: str, cluster_id: str) -> set[str]:
    resp = api.call("GET", f"/v1beta1/{parent}/modelDevelopmentClusters/{cluster_id}/nodes")
    assert resp.status_code == 200, resp.json
    return {n["nodeId"] for n in resp.json["nodes"]}


def _never_names_a(resp: Any) -> None:
    """Nothing B is told mentions A's project."""
    assert "projects/pa" not in json.dumps(resp.json), resp.json


def test_defect_8_two_projects_each_have_cluster_ca(api: Api) -> None:
    first = _create_cluster(api, A, "ca", workers=1)
    assert first.status_code == 200, first.json
    second = _create_cluster(api, B, "ca", workers=2)  # main: 409 "cluster id ca is taken"
    assert second.status_code == 200, second.json
    _never_names_a(second)
    for parent, op in ((A, first.json), (B, second.json)):
        done = api.done(op)
        assert "error" not in done, done
        assert done["response"]["name"] == f"{parent}/modelDevelopmentClusters/ca"
    # the first project's ids are the domain's unchanged: its node names are today's
    a_nodes, b_nodes = _nodes(api, A, "ca"), _nodes(api, B, "ca")
    assert "ca-gpu-000" in a_nodes and len(a_nodes) == 2 and len(b_nodes) == 3
    # B reads its nodes under its own cluster id, no internal tag (the shape of Vertex's
    # nodeId, CLUSTER-POOL-INDEX); they are B's machines, not A's of the same name
    assert {"ca-gpu-000", "ca-gpu-001"} <= b_nodes and all(len(n) < 12 for n in b_nodes)
    drained = api.call("POST", f"/v1beta1/{B}/modelDevelopmentClusters/ca/nodes/ca-gpu-001"
                       ":drain", {"reason": "fan"})
    assert drained.status_code == 200, drained.json
    assert drained.json["nodeId"] == "ca-gpu-001" and drained.json["state"] == "drained"
    assert drained.json["name"] == f"{B}/modelDevelopmentClusters/ca/nodes/ca-gpu-001"
    a_states = {n["nodeId"]: n["state"] for n in api.call(
        "GET", f"/v1beta1/{A}/modelDevelopmentClusters/ca/nodes").json["nodes"]}
    assert a_states.get("ca-gpu-001", "idle") != "drained"  # A's node of that name untouched
    assert api.call("POST", f"/v1beta1/{B}/modelDevelopmentClusters/ca/nodes/ca-gpu-001"
                    ":resume", {"reason": "fan replaced"}).status_code == 200
    for parent, size in ((A, 1), (B, 2)):
        got = api.call("GET", f"/v1beta1/{parent}/modelDevelopmentClusters/ca").json
        assert got["name"] == f"{parent}/modelDevelopmentClusters/ca"
        assert got["state"] == "READY" and got["mtcNodes"]["total"] == size
        listed = api.call("GET", f"/v1beta1/{parent}/modelDevelopmentClusters").json
        assert [c["name"] for c in listed["modelDevelopmentClusters"]] == [got["name"]]
    # same project, same id: as before (a replay answers the same; another body is a 409)
    replay = _create_cluster(api, B, "ca", workers=2)
    assert replay.status_code == 200 and replay.json["name"] == second.json["name"]
    clash = _create_cluster(api, B, "ca", workers=3)
    assert clash.status_code == 409, clash.json
    _never_names_a(clash)

    # a job on B's ca runs on B's nodes and names B's cluster by its API id
    made = api.call("POST", f"/v1/{B}/customJobs?customJobId=j1", _job("ca"))
    assert made.status_code == 200, made.json
    assert made.json["mtcProgress"]["clusterId"] == "ca"
    assert api.call("POST", f"/v1/{A}/customJobs?customJobId=j1", _job("ca")).status_code == 200
    deadline = time.monotonic() + 30
    while (job := api.call("GET", f"/v1/{B}/customJobs/j1").json)["state"] not in (
            "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"):
        assert time.monotonic() < deadline, job
        api.app.pump(budget_s=0.3)
        time.sleep(0.05)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert set(job["mtcProgress"]["nodes"]) <= b_nodes
    assert job["name"] == f"{B}/customJobs/j1" and job["mtcProgress"]["clusterId"] == "ca"
    assert [j["name"] for j in api.call("GET", f"/v1/{B}/customJobs").json["customJobs"]] == [
        f"{B}/customJobs/j1"]

    # B's update and delete touch B's cluster only
    resized = api.call("PATCH", f"/v1beta1/{B}/modelDevelopmentClusters/ca",
                       cluster_body(workers=1))
    assert resized.status_code == 200, resized.json
    api.done(resized.json)
    resized_b = api.call("GET", f"/v1beta1/{B}/modelDevelopmentClusters/ca").json
    assert resized_b["mtcNodes"]["total"] == 1 and _nodes(api, A, "ca") == a_nodes
    gone = api.call("DELETE", f"/v1beta1/{B}/modelDevelopmentClusters/ca?force=true")
    assert gone.status_code == 200, gone.json
    api.done(gone.json)
    missing = api.call("GET", f"/v1beta1/{B}/modelDevelopmentClusters/ca")
    assert missing.status_code == 404
    _never_names_a(missing)
    kept = api.call("GET", f"/v1beta1/{A}/modelDevelopmentClusters/ca").json
    assert kept["state"] == "READY" and kept["mtcNodes"]["total"] == 1


def test_defect_8_two_projects_each_have_model_m1(api: Api) -> None:
    for parent in (A, B):
        resp = api.call("POST", f"/v1/{parent}/models:upload",
                        {"modelId": "m1", "model": {**_model(parent), "description": parent}})
        assert resp.status_code == 200, resp.json  # main: B's is a 409 naming A's model
        assert resp.json["response"]["model"] == f"{parent}/models/m1"
    again = api.call("POST", f"/v1/{B}/models:upload", {"modelId": "m1", "model": _model(B)})
    assert again.status_code == 409 and f"{B}/models/m1" in again.json["error"]["message"]
    _never_names_a(again)
    version = api.call("POST", f"/v1/{B}/models:upload",
                       {"parentModel": f"{B}/models/m1", "model": _model(B)})
    assert version.status_code == 200 and version.json["response"]["modelVersionId"] == "2"
    for parent, versions in ((A, ["1"]), (B, ["1", "2"])):
        got = api.call("GET", f"/v1/{parent}/models/m1").json
        assert got["name"] == f"{parent}/models/m1" and got["versionId"] == versions[-1]
        listed = api.call("GET", f"/v1/{parent}/models/m1:listVersions").json["models"]
        assert [m["versionId"] for m in listed] == versions
        assert {m["description"] for m in listed if "description" in m} == {parent}
        assert [m["name"] for m in api.call("GET", f"/v1/{parent}/models").json["models"]] == [
            f"{parent}/models/m1"]
    assert api.call("DELETE", f"/v1/{B}/models/m1").status_code == 200
    assert api.call("GET", f"/v1/{B}/models/m1").status_code == 404
    assert api.call("GET", f"/v1/{A}/models/m1").json["name"] == f"{A}/models/m1"


def test_the_domain_id_depends_on_the_parent_and_id_alone() -> None:
    """Home ids are their own; another parent's are derived from (parent, id) and the
    deployment's salt, within the domain's 63 characters; numbers pass through."""
    pin = ids.Ids(A, "salt")
    a, b, c = Parent("pa", "l"), Parent("pb", "l"), Parent("pc", "l")
    assert pin.domain(a, "ca") == "ca" and pin.domain(b, "123") == "123"
    assert pin.domain(b, "ca") == pin.domain(b, "ca") != pin.domain(c, "ca")
    assert pin.domain(b, "ca").startswith("ca-") and pin.domain(b, "ca") != "ca"
    assert pin.domain(b, "ca") != ids.Ids(A, "other").domain(b, "ca")
    long = "x" * 63
    assert len(pin.domain(b, long)) == 63 and pin.domain(b, long) != pin.domain(c, long)


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Api]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    flask_app = create_app(ctx)
    register(flask_app, ctx, tmp_path / "run")
    yield Api(flask_app.test_client(), app)
    app.compute.kill_all()
    app.close()


def test_defect_8_the_console_shows_each_projects_own_ca(console: Api) -> None:
    for parent, workers in ((A, 1), (B, 2)):
        made = _create_cluster(console, parent, "ca", workers=workers)
        assert made.status_code == 200, made.json
        console.done(made.json)
    body: Any = console.client.get("/console/api/poll", headers=AUTH).json
    assert sorted(c["name"] for c in body["clusters"]) == [
        f"{A}/modelDevelopmentClusters/ca", f"{B}/modelDevelopmentClusters/ca"]
    assert {c["id"] for c in body["clusters"]} == {"ca"}
    for parent, workers in ((A, 1), (B, 2)):
        name = f"{parent}/modelDevelopmentClusters/ca"
        poll: Any = console.client.get("/console/api/poll", query_string={"cluster": name},
                                       headers=AUTH).json
        assert poll["grid"][0]["total"] == workers, poll["grid"]
        nodes: Any = console.client.get("/console/api/nodes", query_string={"cluster": name},
                                        headers=AUTH).json
        shown = {n["id"] for n in nodes["nodes"]}
        assert len(shown) >= workers and shown <= _nodes(console, parent, "ca"), shown
        # the cluster's timeline names its nodes as the project's API does, no internal tag
        lines = [e["text"] for e in poll["timeline"]["events"]]
        assert any("ca-gpu-000" in line for line in lines), lines
        assert not any("ca--" in line for line in lines), lines


def test_records_from_before_the_mapper_are_found_under_their_own_parent(api: Api) -> None:
    """A state directory that already held a model in a second project (keyed by its plain
    id, no ``name_id``) keeps it reachable there, and only there."""
    first = api.call("POST", f"/v1/{A}/models:upload", {"modelId": "m1", "model": _model(A)})
    assert first.status_code == 200, first.json  # A is the home project now
    with api.app.transaction() as uow:
        uow.put_record("registry_models", "old", {
            "id": "old", "parent": B, "created": 1.0, "time": 1.0, "next_version": 2,
            "aliases": {"default": "1"}})
        uow.put_record("registry_model_versions", "old@1", {
            "model_id": "old", "parent": B, "version_id": "1", "model": _model(B),
            "lineage": None, "job_key": None, "created": 1.0, "time": 1.0})
    got = api.call("GET", f"/v1/{B}/models/old")
    assert got.status_code == 200 and got.json["name"] == f"{B}/models/old", got.json
    assert api.call("GET", "/v1/projects/pc/locations/l/models/old").status_code == 404
    more = api.call("POST", f"/v1/{B}/models:upload",
                    {"parentModel": f"{B}/models/old", "model": _model(B)})
    assert more.status_code == 200 and more.json["response"]["modelVersionId"] == "2"
    assert [m["versionId"] for m in api.call(
        "GET", f"/v1/{B}/models/old:listVersions").json["models"]] == ["1", "2"]


def test_defect_8_two_projects_each_have_pipeline_p1_uploading_model_pm(api: Api) -> None:
    """The pipelines handler uploads into the project's own model ``pm`` (the registry key
    and the pipeline record are per parent; the handler never maps ids itself)."""
    from tests.unit.api.test_registry_api import pipeline_body, wait_pipeline

    def body(parent: str, **over: Any) -> dict[str, Any]:
        out = pipeline_body(**over)  # each project its own bucket
        out["trainingTaskInputs"]["baseOutputDirectory"] = {
            "outputUriPrefix": f"gs://{parent.split('/')[1]}-bucket/{len(over)}"}
        return out

    for parent in (A, B):
        api.done(_create_cluster(api, parent, "c1", workers=1).json)
        made = api.call("POST", f"/v1/{parent}/trainingPipelines?trainingPipelineId=p1",
                        body(parent, modelId="pm"))
        assert made.status_code == 200, made.json  # main: B's modelId pm is a 409
    for parent in (A, B):
        done = wait_pipeline(api, f"{parent}/trainingPipelines/p1",
                             {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED"})
        assert done["state"] == "PIPELINE_STATE_SUCCEEDED", (done.get("error"), done.get("state"))
        assert done["modelToUpload"]["name"] == f"{parent}/models/pm"
        model = api.call("GET", f"/v1/{parent}/models/pm").json
        assert model["name"] == f"{parent}/models/pm"
        job = done["trainingTaskMetadata"]["backingCustomJob"]
        assert job.startswith(f"{parent}/customJobs/") and model["mtcLineage"]["job"] == job
        assert api.call("GET", f"/v1/{job}").json["mtcModels"] == [f"{parent}/models/pm@1"]
    more = api.call("POST", f"/v1/{B}/trainingPipelines?trainingPipelineId=p2",
                    body(B, parentModel=f"{B}/models/pm", labels={"n": "2"}))
    assert more.status_code == 200, more.json
    done = wait_pipeline(api, f"{B}/trainingPipelines/p2",
                         {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED"})
    assert done["modelToUpload"] == {**done["modelToUpload"], "name": f"{B}/models/pm",
                                     "versionId": "2"}, done
    assert api.call("GET", f"/v1/{A}/models/pm").json["versionId"] == "1"
    assert api.call("DELETE", f"/v1/{B}/trainingPipelines/p1").status_code == 200
    assert api.call("GET", f"/v1/{A}/trainingPipelines/p1").status_code == 200


def test_defect_8_two_projects_each_have_tuning_job_h1(api: Api) -> None:
    from tests.unit.api.test_tuning_api import body

    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    for parent in (A, B):
        api.done(_create_cluster(api, parent, "c1", workers=1).json)
        made = api.call("POST", f"/v1/{parent}/hyperparameterTuningJobs"
                        "?hyperparameterTuningJobId=h1", body(slow, parallelTrialCount=1))
        assert made.status_code == 200, made.json  # main: B's is a 409
        assert made.json["name"] == f"{parent}/hyperparameterTuningJobs/h1"
    assert api.call("POST", f"/v1/{B}/hyperparameterTuningJobs/h1:cancel").json == {}

    def cancelled() -> bool:
        got = api.call("GET", f"/v1/{B}/hyperparameterTuningJobs/h1").json
        return bool(got["state"] == "JOB_STATE_CANCELLED")

    assert api.app.run(cancelled, timeout_s=30, tick_s=1)
    assert api.call("DELETE", f"/v1/{B}/hyperparameterTuningJobs/h1").status_code == 200
    mine = api.call("GET", f"/v1/{A}/hyperparameterTuningJobs").json["hyperparameterTuningJobs"]
    assert [(j["name"], j["state"]) for j in mine] == [
        (f"{A}/hyperparameterTuningJobs/h1", mine[0]["state"])]
    assert mine[0]["state"] != "JOB_STATE_CANCELLED"
    assert api.call("GET", f"/v1/{B}/hyperparameterTuningJobs").json.get(
        "hyperparameterTuningJobs", []) == []
