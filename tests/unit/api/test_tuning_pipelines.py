"""Training pipelines with a hyperparameter tuning task, over the Flask test client: bad
inputs are 400s naming ``trainingTaskInputs.*``; a small grid of examples/hp_trial.py runs
as the pipeline's tuning job and the best trial's model is uploaded with its lineage; a
cancelled one uploads nothing."""

from __future__ import annotations

import copy
from typing import Any

from tests.serving import PARENT
from tests.unit.api.conftest import Api
from tests.unit.api.test_registry_api import MODELS, PIPELINES, TUNING_TASK, wait_pipeline
from tests.unit.api.test_tuning_api import body as tuning_body
from tests.unit.api.test_vertex_surface import violation

ENDED = {"PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED", "PIPELINE_STATE_CANCELLED"}


def pipeline(**inputs: Any) -> dict[str, Any]:
    task = {k: v for k, v in tuning_body().items() if k not in ("displayName",)}
    task.update(inputs)
    return {"displayName": "hp-pipe", "trainingTaskDefinition": TUNING_TASK,
            "trainingTaskInputs": {k: v for k, v in task.items() if v is not None},
            "modelToUpload": {"displayName": "hp-model"}}


def test_bad_tuning_inputs_are_400s_naming_training_task_inputs(api: Api) -> None:
    api.cluster()
    spec = tuning_body()["studySpec"]
    trial = copy.deepcopy(tuning_body()["trialJobSpec"])
    cases = [
        (pipeline(studySpec=None), "trainingTaskInputs.studySpec"),
        (pipeline(studySpec={**spec, "algorithm": "GRID"}), "trainingTaskInputs.studySpec.algorithm"),
        (pipeline(studySpec={**spec, "metrics": []}), "trainingTaskInputs.studySpec.metrics"),
        (pipeline(maxTrialCount=0), "trainingTaskInputs.maxTrialCount"),
        (pipeline(parallelTrialCount=5), "trainingTaskInputs.parallelTrialCount"),
        (pipeline(trialJobSpec=None), "trainingTaskInputs.trialJobSpec"),
        (pipeline(trialJobSpec={**trial, "persistentResourceId": "nope"}),
         "trainingTaskInputs.trialJobSpec.persistentResourceId"),
        (pipeline(trialJobSpec={**trial, "baseOutputDirectory": {"outputUriPrefix": "/etc"}}),
         "trainingTaskInputs.trialJobSpec.baseOutputDirectory.outputUriPrefix"),
        (pipeline(trialJobSpec={**trial, "workerPoolSpecs": [{
            **trial["workerPoolSpecs"][0], "machineSpec": {"machineType": "a3-highgpu-8g"}}]}),
         "trainingTaskInputs.trialJobSpec.workerPoolSpecs[0].machineSpec"),
        (pipeline(workerPoolSpecs=[]), "trainingTaskInputs.workerPoolSpecs"),
        (pipeline(trials=[{"id": "1"}]), "trainingTaskInputs.trials"),
        (pipeline(maxTrialCount="many"), "trainingTaskInputs.maxTrialCount"),
        ({**pipeline(), "trainingTaskInputs": None}, "trainingTaskInputs"),
    ]
    for bad, field in cases:
        assert violation(api.call("POST", PIPELINES, bad)) == field, bad
    assert api.call("GET", PIPELINES).json.get("trainingPipelines", []) == []
    assert api.call("GET", f"/v1/{PARENT}/hyperparameterTuningJobs").json.get(
        "hyperparameterTuningJobs", []) == []


def test_the_best_trials_model_is_uploaded_when_the_tuning_job_succeeds(api: Api) -> None:
    api.cluster()
    resp = api.call("POST", f"{PIPELINES}?trainingPipelineId=hp1", pipeline())
    assert resp.status_code == 200, resp.json
    created = resp.json
    tuning_job = created["trainingTaskMetadata"]["backingHyperparameterTuningJob"]
    assert tuning_job.startswith(f"{PARENT}/hyperparameterTuningJobs/")
    assert created["state"] == "PIPELINE_STATE_RUNNING"
    again = api.call("POST", f"{PIPELINES}?trainingPipelineId=hp1", pipeline())
    assert again.json["trainingTaskMetadata"] == created["trainingTaskMetadata"]  # a retry
    got = wait_pipeline(api, created["name"], ENDED, timeout=60)
    assert got["state"] == "PIPELINE_STATE_SUCCEEDED", got
    study = api.call("GET", f"/v1/{tuning_job}").json
    assert study["state"] == "JOB_STATE_SUCCEEDED" and len(study["trials"]) == 3
    losses = {t["id"]: t["finalMeasurement"]["metrics"][0]["value"] for t in study["trials"]}
    best = min(losses, key=lambda k: losses[k])  # MINIMIZE loss
    trial = next(t for t in study["trials"] if t["id"] == best)
    assert got["trainingTaskMetadata"]["bestTrial"] == best
    assert got["trainingTaskMetadata"]["bestTrialBackingCustomJob"] == trial["customJob"]
    model = api.call("GET", f"/v1/{got['modelToUpload']['name']}").json
    assert model["displayName"] == "hp-model" and model["trainingPipeline"] == created["name"]
    lineage = model["mtcLineage"]
    assert lineage["job"] == trial["customJob"] and lineage["attempt"] == 1
    assert lineage["trial"] == best and lineage["tuningJob"] == tuning_job
    assert lineage["checkpointStep"] == "6", lineage
    job = api.call("GET", f"/v1/{trial['customJob']}").json
    assert job["mtcModels"] == [f"{model['name']}@1"]
    assert model["artifactUri"].endswith("/model") and job["jobSpec"]
    models = api.call("GET", MODELS).json["models"]
    assert [m["name"] for m in models] == [model["name"]]  # one upload, not one per trial
    api.app.pump(budget_s=0.5)  # later ticks change nothing
    assert api.call("GET", f"/v1/{created['name']}").json["modelToUpload"] == got["modelToUpload"]


def test_a_cancelled_tuning_pipeline_uploads_nothing(api: Api) -> None:
    api.cluster()
    trial = copy.deepcopy(tuning_body()["trialJobSpec"])
    trial["workerPoolSpecs"][0]["containerSpec"]["command"] += ["--steps=400", "--step-time=0.5"]
    created = api.call("POST", PIPELINES, pipeline(trialJobSpec=trial)).json
    assert api.call("POST", f"/v1/{created['name']}:cancel").status_code == 200
    got = wait_pipeline(api, created["name"], ENDED, timeout=30)
    assert got["state"] == "PIPELINE_STATE_CANCELLED" and got["error"]["code"] == 1
    assert "name" not in got["modelToUpload"]
    assert api.call("POST", f"/v1/{created['name']}:cancel").status_code == 400
    assert api.call("GET", MODELS).json.get("models", []) == []
    study = api.call("GET", f"/v1/{got['trainingTaskMetadata']['backingHyperparameterTuningJob']}")
    assert study.json["state"] == "JOB_STATE_CANCELLED"
    assert api.call("DELETE", f"/v1/{created['name']}").json["done"] is True
