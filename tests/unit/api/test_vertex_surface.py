"""The Vertex REST surface through the real Flask app: proto3 JSON both ways, errors as
google.rpc.Status naming the field, limits, paging, filters, Operations, project isolation,
audit. Each test asserts what a client would see."""

from __future__ import annotations

import json
import sys
from typing import Any

from services.api.paging import paginate
from tests.serving import PARENT
from tests.unit.api.conftest import AUTH, Api

JOBS = f"/v1/{PARENT}/customJobs"


def job_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "displayName": "j",
        "jobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": 13,
                            "acceleratorCount": 8},
            "replicaCount": "1",
            "containerSpec": {"imageUri": "local",
                              "command": [sys.executable, "-c", "import time; time.sleep(30)"]},
        }]},
    }
    body.update(over)
    return body


def violation(resp: Any) -> str:
    assert resp.status_code == 400, resp.json
    err = resp.json["error"]
    assert err["status"] == "INVALID_ARGUMENT"
    fields = [v["field"] for d in err["details"] for v in d.get("fieldViolations", [])]
    return fields[0]


def test_proto3_json_in_both_cases_with_int64_strings_and_enum_numbers(api: Api) -> None:
    api.cluster()
    body = job_body(labels={"team": "ml"})
    body["job_spec"] = body.pop("jobSpec")  # the proto's snake_case name is accepted too
    body["job_spec"]["scheduling"] = {"timeout": "90.5s", "strategy": 4, "mtcPriority": 5}
    resp = api.call("POST", f"{JOBS}?customJobId=j1", body)
    assert resp.status_code == 200, resp.json
    out = resp.json
    pool = out["jobSpec"]["workerPoolSpecs"][0]
    assert pool["replicaCount"] == "1"  # int64 printed as a string
    assert pool["machineSpec"]["acceleratorType"] == "NVIDIA_H100_80GB"  # enum by name
    assert out["jobSpec"]["scheduling"] == {"timeout": "90.5s", "strategy": "SPOT",
                                            "mtcPriority": 5}
    assert out["labels"] == {"team": "ml"}
    assert out["name"] == f"{PARENT}/customJobs/j1"
    assert out["createTime"].endswith("Z")
    again = api.call("GET", f"{JOBS}/j1").json
    assert again["jobSpec"] == out["jobSpec"] and again["labels"] == {"team": "ml"}


def test_unknown_and_unsupported_fields_are_refused_by_name(api: Api) -> None:
    api.cluster()
    typo = job_body()
    typo["jobSpec"]["workerPoolSpecs"][0]["replicaCont"] = 2
    assert violation(api.call("POST", JOBS, typo)) == "jobSpec.workerPoolSpecs[0].replicaCont"
    net = job_body()
    net["jobSpec"]["network"] = "projects/p/global/networks/n"
    assert violation(api.call("POST", JOBS, net)) == "jobSpec.network"
    image = job_body()
    image["jobSpec"]["workerPoolSpecs"][0]["containerSpec"] = {"imageUri": "gcr.io/a/b"}
    assert violation(api.call("POST", JOBS, image)) == \
        "jobSpec.workerPoolSpecs[0].containerSpec.command"
    out = job_body()
    out["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "/etc"}
    assert violation(api.call("POST", JOBS, out)) == \
        "jobSpec.baseOutputDirectory.outputUriPrefix"
    out["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "gs://bucket/../../etc"}
    assert violation(api.call("POST", JOBS, out)) == \
        "jobSpec.baseOutputDirectory.outputUriPrefix"
    no_cluster = job_body()
    no_cluster["jobSpec"]["persistentResourceId"] = "nope"
    assert violation(api.call("POST", JOBS, no_cluster)) == "jobSpec.persistentResourceId"
    listed = api.call("GET", JOBS).json
    assert listed.get("customJobs", []) == []  # nothing was created by any of them


def test_bodies_that_are_not_json_objects_get_400_or_413_never_500(api: Api) -> None:
    def post(data: bytes) -> Any:
        return api.client.post(JOBS, data=data, headers={**AUTH,
                                                         "Content-Type": "application/json"})

    assert post(b"\xff\xfe{}").status_code == 400
    assert post(b"[" * 100_000).status_code == 400
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    assert post(json.dumps({"a": deep}).encode()).status_code == 400
    assert post(b"{nope").status_code == 400
    assert post(b"[1, 2]").status_code == 400
    big = post(b'{"displayName": "' + b"x" * (2 << 20) + b'"}')
    assert big.status_code == 413
    assert big.json["error"]["status"] == "RESOURCE_EXHAUSTED"


def test_every_call_needs_a_token_and_the_right_role(api: Api) -> None:
    assert api.call("GET", JOBS, headers={}).status_code == 401
    assert api.call("GET", JOBS, headers={"Authorization": "Bearer wrong"}).status_code == 401
    from services.api.tokens import LocalTokens

    viewer = LocalTokens(api.app.state_dir / "api-tokens.json").create("token:v", "viewer")
    headers = {"Authorization": f"Bearer {viewer}"}
    assert api.call("GET", JOBS, headers=headers).status_code == 200
    denied = api.call("POST", JOBS, job_body(), headers=headers)
    assert denied.status_code == 403
    assert "aiplatform.customJobs.create" in denied.json["error"]["message"]


def test_paging_and_filters(api: Api) -> None:
    api.cluster()
    for i in range(3):
        body = job_body(displayName=f"j{i}", labels={"team": "a" if i else "b"})
        assert api.call("POST", f"{JOBS}?customJobId=j{i}", body).status_code == 200
    names, token = [], ""
    while True:
        page = api.call("GET", f"{JOBS}?pageSize=2&pageToken={token}").json
        names += [j["name"].rsplit("/", 1)[1] for j in page["customJobs"]]
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert names == ["j0", "j1", "j2"]
    team_a = api.call("GET", f'{JOBS}?filter=labels.team="a"').json["customJobs"]
    assert [j["displayName"] for j in team_a] == ["j1", "j2"]
    by_name = api.call("GET", f"{JOBS}?filter=display_name=j0").json["customJobs"]
    assert [j["displayName"] for j in by_name] == ["j0"]
    assert violation(api.call("GET", f"{JOBS}?filter=colour=red")) == "filter"
    assert violation(api.call("GET", f"{JOBS}?pageSize=-1")) == "pageSize"
    other = paginate([1, 2, 3], size=1, token=None, filter_text="x").next_page_token
    assert violation(api.call("GET", f"{JOBS}?pageToken={other}")) == "pageToken"


def test_other_projects_cannot_see_or_use_a_cluster(api: Api) -> None:
    api.cluster()
    other = "/v1/projects/q/locations/l/customJobs"
    assert violation(api.call("POST", other, job_body())) == "jobSpec.persistentResourceId"
    assert api.call("GET", "/v1beta1/projects/q/locations/l/modelDevelopmentClusters/c1"
                    ).status_code == 404
    resp = api.call("POST", "/v1beta1/projects/q/locations/l/modelDevelopmentClusters"
                    "?modelDevelopmentClusterId=c1", {"nodePools": []})
    assert resp.status_code in (400, 409)


def test_cluster_shape_errors_name_the_wire_field(api: Api) -> None:
    from tests.serving import cluster_body

    base = f"/v1beta1/{PARENT}/modelDevelopmentClusters?modelDevelopmentClusterId=c9"
    body = cluster_body()
    body["nodePools"][1]["scalingSpec"] = {"minNodeCount": 1, "maxNodeCount": 4}
    assert violation(api.call("POST", base, body)) == "nodePools[1].scalingSpec.maxNodeCount"
    body = cluster_body()
    body["nodePools"][1]["mtcHotSpareCount"] = 99
    assert violation(api.call("POST", base, body)) == "nodePools[1].mtcHotSpareCount"
    body = cluster_body()
    body["orchestratorSpec"]["slurmSpec"]["partitions"][0]["nodePoolIds"] = ["gpux"]
    assert violation(api.call("POST", base, body)) == \
        "orchestratorSpec.slurmSpec.partitions[0].nodePoolIds[0]"
    body = cluster_body()
    body["nodePools"][1]["scalingSpec"]["minNodeCount"] = "4x"
    assert violation(api.call("POST", base, body)) == "nodePools[1].scalingSpec.minNodeCount"


def test_cluster_operations_and_delete(api: Api) -> None:
    op = api.cluster(workers=2)
    assert op["response"]["@type"].endswith("ModelDevelopmentCluster")
    assert op["response"]["mtcNodes"]["total"] == 2
    assert op["metadata"]["genericMetadata"]["createTime"]
    ops = api.call("GET", f"/v1/{PARENT}/operations").json["operations"]
    assert [o["name"] for o in ops] == [op["name"]]
    assert api.call("GET", f"/v1beta1/{op['name']}").json["done"] is True
    nodes = api.call("GET", f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1/nodes").json
    assert len([n for n in nodes["nodes"] if n["role"] == "worker"]) == 2
    cluster = api.call("GET", f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1").json
    resized = {k: v for k, v in cluster.items()
               if k in ("displayName", "nodePools", "orchestratorSpec")}
    resized["nodePools"][1]["scalingSpec"] = {"minNodeCount": "3", "maxNodeCount": "3"}
    update = api.call("PATCH", f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1", resized)
    assert update.status_code == 200, update.json
    done = api.call("POST", f"/v1beta1/{update.json['name']}:wait", {"timeout": "20s"}).json
    assert done["done"] and done["response"]["mtcNodes"]["total"] == 3
    delete = api.call("DELETE", f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1").json
    gone = api.call("POST", f"/v1beta1/{delete['name']}:wait", {"timeout": "20s"}).json
    assert gone["done"] and gone["response"]["@type"].endswith("Empty")
    assert api.call("GET", f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1").status_code == 404
    assert api.call("DELETE", f"/v1/{gone['name']}").status_code == 200
    assert api.call("GET", f"/v1/{gone['name']}").status_code == 404


def test_job_delete_needs_a_finished_job_and_mutations_are_audited(api: Api) -> None:
    api.cluster()
    assert api.call("POST", f"{JOBS}?customJobId=j1", job_body()).status_code == 200
    running = api.call("DELETE", f"{JOBS}/j1")
    assert running.status_code == 400
    assert running.json["error"]["status"] == "FAILED_PRECONDITION"
    assert api.call("POST", f"{JOBS}/j1:cancel").json == {}
    for _ in range(100):
        if api.call("GET", f"{JOBS}/j1").json["state"] == "JOB_STATE_CANCELLED":
            break
        api.app.pump(budget_s=0.2)
    op = api.call("DELETE", f"{JOBS}/j1").json
    assert op["done"] is True and op["response"]["@type"].endswith("Empty")
    assert api.call("GET", f"{JOBS}/j1").status_code == 404
    from services.api.audit import AuditLog

    trail = AuditLog(api.app.store, 3600).read()
    assert [(r["method"], r["permission"], r["status"]) for r in trail][-3:] == [
        ("DELETE", "aiplatform.customJobs.delete", 400),
        ("POST", "aiplatform.customJobs.cancel", 200),
        ("DELETE", "aiplatform.customJobs.delete", 200)]
    assert {r["who"] for r in trail} == {"token:env-admin"}


def test_unknown_paths_and_methods(api: Api) -> None:
    assert api.call("GET", "/v1/nothing").status_code == 404
    wrong = api.call("PUT", JOBS)
    assert wrong.status_code == 405
    assert wrong.json["error"]["message"].startswith("PUT is not a method")


def test_env_name_injection_is_refused_at_the_api(api: Api) -> None:
    api.cluster()
    body = job_body()
    body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"] = [
        {"name": "X; touch PWNED; Y", "value": "1"}]
    assert violation(api.call("POST", JOBS, body)) == \
        "jobSpec.workerPoolSpecs[0].containerSpec.env[0].name"
    body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"] = [
        {"name": "OK_NAME", "value": "$(touch PWNED) 'quoted'"}]
    assert api.call("POST", JOBS, body).status_code == 200  # values are data, kept literal


def test_same_job_id_with_another_body_is_already_exists(api: Api) -> None:
    api.cluster()
    assert api.call("POST", f"{JOBS}?customJobId=j1", job_body()).status_code == 200
    assert api.call("POST", f"{JOBS}?customJobId=j1", job_body()).status_code == 200  # retry
    other = api.call("POST", f"{JOBS}?customJobId=j1", job_body(displayName="other"))
    assert other.status_code == 409
    assert other.json["error"]["status"] == "ALREADY_EXISTS"


def test_nul_characters_are_refused(api: Api) -> None:
    api.cluster()
    body = job_body()
    body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = ["python\x00", "-c"]
    assert violation(api.call("POST", JOBS, body)) == "(body)"


def test_cancelling_an_ended_job_is_refused_naming_its_state(api: Api) -> None:
    """It answered 200 {} and changed nothing."""
    api.cluster()
    body = job_body()
    body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = [sys.executable, "-c",
                                                                        "pass"]
    assert api.call("POST", f"{JOBS}?customJobId=quick", body).status_code == 200
    for _ in range(200):
        if api.call("GET", f"{JOBS}/quick").json["state"] == "JOB_STATE_SUCCEEDED":
            break
        api.app.pump(budget_s=0.2)
    refused = api.call("POST", f"{JOBS}/quick:cancel")
    assert refused.status_code == 400, refused.json
    assert refused.json["error"]["status"] == "FAILED_PRECONDITION"
    assert "JOB_STATE_SUCCEEDED" in refused.json["error"]["message"]
    assert api.call("GET", f"{JOBS}/quick").json["state"] == "JOB_STATE_SUCCEEDED"


def test_a_failed_job_says_why_with_the_failing_ranks_last_output(api: Api) -> None:
    """A failed replica's exit code and last lines go into error.message (the cause
    was only in `mtc job logs`)."""
    api.cluster()
    body = job_body()
    body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = [
        sys.executable, "-c", "import no_such_module_for_mtc"]
    assert api.call("POST", f"{JOBS}?customJobId=broken", body).status_code == 200
    for _ in range(200):
        job = api.call("GET", f"{JOBS}/broken").json
        if job["state"] == "JOB_STATE_FAILED":
            break
        api.app.pump(budget_s=0.2)
    message = job["error"]["message"]
    assert "code 1" in message or "exit codes rank 0: 1" in message, message
    assert "ModuleNotFoundError: No module named 'no_such_module_for_mtc'" in message, message
