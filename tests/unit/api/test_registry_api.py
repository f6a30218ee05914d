"""The Model Registry and training pipelines through the Flask app: uploads, versions and
aliases, lineage both ways, paging, the pipeline's upload on its job's JobFinished, and
bad input as 400s naming the field."""

from __future__ import annotations

import sys
import time
from typing import Any

from tests.serving import PARENT
from tests.unit.api.conftest import Api
from tests.unit.api.test_vertex_surface import job_body, violation

MODELS = f"/v1/{PARENT}/models"
PIPELINES = f"/v1/{PARENT}/trainingPipelines"
JOBS = f"/v1/{PARENT}/customJobs"
CUSTOM_TASK = "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml"
TUNING_TASK = ("gs://google-cloud-aiplatform/schema/trainingjob/definition/"
               "hyperparameter_tuning_task_1.0.0.yaml")
WRITE_MODEL = ("import os, pathlib; "  # a gs:// directory is written at /gcs/, as on Vertex
               "p = pathlib.Path(os.environ['AIP_MODEL_DIR'].replace('gs://', '/gcs/')); "
               "p.mkdir(parents=True, exist_ok=True); (p / 'model.txt').write_text('ok')")


def upload(api: Api, **model: Any) -> dict[str, Any]:
    extra = {k: model.pop(k) for k in ("modelId", "parentModel") if k in model}
    resp = api.call("POST", f"{MODELS}:upload", {"model": {"displayName": "m", **model}, **extra})
    assert resp.status_code == 200, resp.json
    op = resp.json
    assert op["done"] and "error" not in op, op
    return op["response"]  # type: ignore[no-any-return]


def pipeline_body(code: str = WRITE_MODEL, **over: Any) -> dict[str, Any]:
    inputs = job_body()["jobSpec"]
    inputs["workerPoolSpecs"][0]["containerSpec"]["command"] = [sys.executable, "-c", code]
    inputs["baseOutputDirectory"] = {"outputUriPrefix": "gs://bucket/runs/p1"}
    body = {"displayName": "pipe", "trainingTaskDefinition": CUSTOM_TASK,
            "trainingTaskInputs": inputs,
            "modelToUpload": {"displayName": "pipe-model", "labels": {"team": "ml"}}}
    body.update(over)
    return body


def wait_pipeline(api: Api, name: str, states: set[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = api.call("GET", f"/v1/{name}").json
        if got["state"] in states:
            return got  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, got
        api.app.pump(budget_s=0.2)


def test_versions_aliases_and_delete(api: Api) -> None:
    first = upload(api, modelId="reg", artifactUri="gs://b/m1")
    assert first == {"@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse",
                     "model": f"{PARENT}/models/reg", "modelVersionId": "1"}
    second = upload(api, parentModel=f"{PARENT}/models/reg", artifactUri="gs://b/m2")
    assert second["modelVersionId"] == "2"
    versions = api.call("GET", f"{MODELS}/reg:listVersions").json["models"]
    assert [(v["versionId"], v["versionAliases"]) for v in versions] == [("1", []),
                                                                         ("2", ["default"])]
    assert api.call("GET", f"{MODELS}/reg").json["artifactUri"] == "gs://b/m2"
    assert api.call("GET", f"{MODELS}/reg@1").json["artifactUri"] == "gs://b/m1"
    moved = api.call("POST", f"{MODELS}/reg@1:mergeVersionAliases",
                     {"versionAliases": ["default", "champion"]}).json
    assert moved["versionAliases"] == ["default", "champion"]
    assert api.call("GET", f"{MODELS}/reg@champion").json["versionId"] == "1"
    assert api.call("GET", f"{MODELS}/reg").json["versionId"] == "1"
    # the default version cannot go, nor the default alias; another version can
    assert api.call("DELETE", f"{MODELS}/reg@1").status_code == 400
    assert violation(api.call("POST", f"{MODELS}/reg@1:mergeVersionAliases",
                              {"versionAliases": ["-default"]})) == "versionAliases[0]"
    op = api.call("DELETE", f"{MODELS}/reg@2").json
    assert op["done"] and "error" not in op
    assert api.call("GET", f"{MODELS}/reg@2").status_code == 404
    op = api.call("DELETE", f"{MODELS}/reg").json
    assert op["done"] and api.call("GET", f"/v1/{op['name']}").json["done"]
    assert api.call("GET", f"{MODELS}/reg").status_code == 404
    assert api.call("GET", MODELS).json.get("models", []) == []


def test_list_paging_and_filter(api: Api) -> None:
    for i in range(5):
        upload(api, modelId=f"m{i}", displayName="even" if i % 2 == 0 else "odd")
    seen, token = [], ""
    while True:
        page = api.call("GET", f"{MODELS}?pageSize=2&pageToken={token}").json
        seen += [m["name"].rsplit("/", 1)[1] for m in page["models"]]
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert seen == [f"m{i}" for i in range(5)]
    evens = api.call("GET", f'{MODELS}?filter=displayName="even"').json["models"]
    assert [m["name"].rsplit("/", 1)[1] for m in evens] == ["m0", "m2", "m4"]
    first = api.call("GET", f"{MODELS}?pageSize=1&filter=displayName=%22odd%22").json
    assert violation(api.call("GET", f"{MODELS}?pageSize=1&pageToken={first['nextPageToken']}"
                              )) == "pageToken"
    assert violation(api.call("GET", f"{MODELS}?filter=nope=1")) == "filter"
    assert violation(api.call("GET", f"{MODELS}?pageSize=x")) == "pageSize"


def test_bad_uploads_are_400s_naming_the_field(api: Api) -> None:
    upload(api, modelId="taken")
    cases = [
        ({"model": {}}, "model.displayName"),
        ({"model": {"displayName": "m", "artifactUrl": "x"}}, "model.artifactUrl"),
        ({"model": {"displayName": "m"}, "modelId": "Bad_Id"}, "modelId"),
        ({"model": {"displayName": "m"}, "parentModel": "models/x"}, "parentModel"),
        ({"model": {"displayName": "m"}, "parentModel": f"{PARENT}/models/none"}, "parentModel"),
        ({"model": {"displayName": "m"}, "modelId": "a", "parentModel": f"{PARENT}/models/taken"},
         "modelId"),
        ({"model": {"displayName": "m", "versionAliases": ["1"]}}, "model.versionAliases[0]"),
        ({"model": {"displayName": "m", "encryptionSpec": {"kmsKeyName": "k"}}},
         "model.encryptionSpec"),
        ({"model": {"displayName": "m", "mtcLineage": {"job": "nope"}}}, "model.mtcLineage.job"),
        ({}, "model"),
    ]
    for body, field in cases:
        assert violation(api.call("POST", f"{MODELS}:upload", body)) == field, body
    dup = api.call("POST", f"{MODELS}:upload", {"model": {"displayName": "m"}, "modelId": "taken"})
    assert dup.status_code == 409
    other = "/v1/projects/other/locations/l/models/taken"
    assert api.call("GET", other).status_code == 404
    assert api.call("GET", f"{MODELS}/taken@9").status_code == 404
    assert api.call("GET", f"{MODELS}/@").status_code == 404


def test_a_pipeline_uploads_its_model_when_the_job_succeeds(api: Api) -> None:
    api.cluster()
    resp = api.call("POST", f"{PIPELINES}?trainingPipelineId=p1", pipeline_body(modelId="pm"))
    assert resp.status_code == 200, resp.json
    created = resp.json
    assert created["state"] in ("PIPELINE_STATE_QUEUED", "PIPELINE_STATE_PENDING",
                                "PIPELINE_STATE_RUNNING")
    job_name = created["trainingTaskMetadata"]["backingCustomJob"]
    done = wait_pipeline(api, created["name"], {"PIPELINE_STATE_SUCCEEDED",
                                                "PIPELINE_STATE_FAILED"})
    assert done["state"] == "PIPELINE_STATE_SUCCEEDED", done
    assert done["modelToUpload"]["name"] == f"{PARENT}/models/pm"
    assert done["modelToUpload"]["versionId"] == "1"
    assert "endTime" in done and "startTime" in done
    model = api.call("GET", f"{MODELS}/pm").json
    assert model["artifactUri"] == "gs://bucket/runs/p1/model"
    assert model["trainingPipeline"] == created["name"]
    assert model["labels"] == {"team": "ml"}
    lineage = model["mtcLineage"]
    assert lineage["job"] == job_name and lineage["attempt"] == 1
    assert lineage["inputs"]["baseOutputDirectory"] == "gs://bucket/runs/p1"
    assert lineage["inputs"]["command"][-1] == WRITE_MODEL
    job = api.call("GET", f"/v1/{job_name}").json
    assert job["mtcModels"] == [f"{PARENT}/models/pm@1"]
    # a retried create answers the same pipeline; the same id with another body is 409
    again = api.call("POST", f"{PIPELINES}?trainingPipelineId=p1", pipeline_body(modelId="pm"))
    assert again.status_code == 200 and again.json["name"] == created["name"]
    other = api.call("POST", f"{PIPELINES}?trainingPipelineId=p1", pipeline_body(displayName="x"))
    assert other.status_code == 409
    # a direct upload of the job's model dir finds the job: lineage without a pipeline
    ref = upload(api, parentModel=f"{PARENT}/models/pm", artifactUri="gs://bucket/runs/p1/model/")
    v2 = api.call("GET", f"{MODELS}/pm@{ref['modelVersionId']}").json
    assert v2["mtcLineage"]["job"] == job_name and "trainingPipeline" not in v2["mtcLineage"]
    assert api.call("GET", f"/v1/{job_name}").json["mtcModels"] == [
        f"{PARENT}/models/pm@1", f"{PARENT}/models/pm@2"]
    # the handler is idempotent: a redelivered JobFinished uploads nothing twice
    from services.pipelines import handlers
    from shared.domain.events import JobFinished
    with api.app.deps.uow() as uow:
        handlers.on_job_finished(JobFinished(job_id=f"cj-{job_name.rsplit('/', 1)[1]}",
                                             cluster_id="c1", state="JOB_STATE_SUCCEEDED"),
                                 uow, api.app.deps)
        uow.commit()
    assert len(api.call("GET", f"{MODELS}/pm:listVersions").json["models"]) == 2
    listed = api.call("GET", f'{PIPELINES}?filter=state="PIPELINE_STATE_SUCCEEDED"').json
    assert [p["name"] for p in listed["trainingPipelines"]] == [created["name"]]
    op = api.call("DELETE", f"{PIPELINES}/p1").json
    assert op["done"] and api.call("GET", f"{PIPELINES}/p1").status_code == 404
    assert api.call("GET", f"{MODELS}/pm").status_code == 200  # models outlive it


def test_failed_and_cancelled_pipelines_upload_nothing(api: Api) -> None:
    api.cluster()
    failed = api.call("POST", PIPELINES, pipeline_body("raise SystemExit(3)")).json
    got = wait_pipeline(api, failed["name"], {"PIPELINE_STATE_FAILED",
                                              "PIPELINE_STATE_SUCCEEDED"})
    assert got["state"] == "PIPELINE_STATE_FAILED" and got["error"]["code"] == 13
    assert "name" not in got["modelToUpload"]
    slow = api.call("POST", PIPELINES, pipeline_body("import time; time.sleep(60)")).json
    assert api.call("DELETE", f"/v1/{slow['name']}").status_code == 400  # not ended yet
    assert api.call("POST", f"/v1/{slow['name']}:cancel").status_code == 200
    got = wait_pipeline(api, slow["name"], {"PIPELINE_STATE_CANCELLED"})
    assert got["error"]["code"] == 1
    assert api.call("POST", f"/v1/{slow['name']}:cancel").status_code == 400
    assert api.call("DELETE", f"/v1/{slow['name']}").status_code == 200
    assert api.call("GET", MODELS).json.get("models", []) == []


def test_bad_pipelines_are_400s_naming_the_field(api: Api) -> None:
    api.cluster()
    inputs = pipeline_body()["trainingTaskInputs"]
    cases = [
        (pipeline_body(displayName=""), "displayName"),
        (pipeline_body(trainingTaskDefinition="gs://x/y.yaml"), "trainingTaskDefinition"),
        (pipeline_body(trainingTaskDefinition=TUNING_TASK),  # a CustomJobSpec is no tuning task
         "trainingTaskInputs.baseOutputDirectory"),
        (pipeline_body(trainingTaskInputs=None), "trainingTaskInputs"),
        (pipeline_body(trainingTaskInputs={**inputs, "workerPoolSpec": []}),
         "trainingTaskInputs.workerPoolSpec"),
        (pipeline_body(trainingTaskInputs={**inputs, "persistentResourceId": ""}),
         "trainingTaskInputs.persistentResourceId"),
        (pipeline_body(trainingTaskInputs={**inputs, "persistentResourceId": "nope"}),
         "trainingTaskInputs.persistentResourceId"),
        (pipeline_body(trainingTaskInputs={**inputs, "baseOutputDirectory": {
            "outputUriPrefix": "/etc"}}), "trainingTaskInputs.baseOutputDirectory.outputUriPrefix"),
        (pipeline_body(modelToUpload={}), "modelToUpload.displayName"),
        (pipeline_body(modelToUpload=None, modelId="x"), "modelToUpload"),
        (pipeline_body(parentModel=f"{PARENT}/models/none"), "parentModel"),
        (pipeline_body(modelId="Bad"), "modelId"),
        (pipeline_body(inputDataConfig={"datasetId": "d"}), "inputDataConfig"),
    ]
    for body, field in cases:
        assert violation(api.call("POST", PIPELINES, body)) == field, body
    assert violation(api.call("POST", f"{PIPELINES}?trainingPipelineId=B", pipeline_body())
                     ) == "trainingPipelineId"
    assert api.call("GET", f"{PIPELINES}/none").status_code == 404
    assert violation(api.call("GET", f"{PIPELINES}?filter=bogus=1")) == "filter"
    assert api.call("GET", PIPELINES).json.get("trainingPipelines", []) == []
