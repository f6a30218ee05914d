"""The official SDK's PipelineServiceClient and ModelServiceClient (REST transport) against a
live `mtc serve`: a custom-task training pipeline runs examples/train.py, its model lands in
the registry with its lineage when the job succeeds, a second version goes on top of it, and
versions, aliases, get by @version and delete work as the SDK expects."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.cloud import aiplatform_v1 as aip
from google.oauth2.credentials import Credentials
from google.protobuf import json_format, struct_pb2

from tests.serving import PARENT, ROOT, create_cluster, mtc_serve

TOKEN = "registry-sdk-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CUSTOM_TASK = "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("registry") / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        op = create_cluster(url, TOKEN, "c1")
        assert "error" not in op, op
        yield url


def clients(url: str) -> tuple[aip.PipelineServiceClient, aip.ModelServiceClient]:
    creds: Any = Credentials(token=TOKEN)
    options = ClientOptions(api_endpoint=url)
    return (aip.PipelineServiceClient(transport="rest", credentials=creds, client_options=options),
            aip.ModelServiceClient(transport="rest", credentials=creds, client_options=options))


def task_inputs(steps: int) -> struct_pb2.Value:
    inputs = {
        "persistentResourceId": "c1",
        "baseOutputDirectory": {"outputUriPrefix": "gs://registry-test/run1"},
        "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                            "acceleratorCount": 8},
            "replicaCount": 1,
            "containerSpec": {"imageUri": "local", "command": [
                sys.executable, str(ROOT / "examples" / "train.py"), "--steps", str(steps),
                "--checkpoint-every", "10"]},
        }],
    }
    return json_format.ParseDict(inputs, struct_pb2.Value())


def test_pipeline_to_registry_through_the_official_sdk(server: str) -> None:
    pipelines, models = clients(server)
    started = time.monotonic()
    created = pipelines.create_training_pipeline(parent=PARENT, training_pipeline=aip.TrainingPipeline(
        display_name="sdk-pipeline", training_task_definition=CUSTOM_TASK,
        training_task_inputs=task_inputs(30),
        model_to_upload=aip.Model(display_name="sdk-model", labels={"team": "sdk"})))
    assert created.name.startswith(f"{PARENT}/trainingPipelines/")
    deadline = time.monotonic() + 30
    while True:
        got = pipelines.get_training_pipeline(name=created.name)
        if got.state in (aip.PipelineState.PIPELINE_STATE_SUCCEEDED,
                         aip.PipelineState.PIPELINE_STATE_FAILED):
            break
        assert time.monotonic() < deadline, got.state
        time.sleep(0.3)
    assert got.state == aip.PipelineState.PIPELINE_STATE_SUCCEEDED, got.error
    model_name = got.model_to_upload.name
    assert model_name.startswith(f"{PARENT}/models/") and got.model_to_upload.version_id == "1"
    job_name = got.training_task_metadata["backingCustomJob"]

    model = models.get_model(name=model_name)
    assert model.display_name == "sdk-model" and model.labels["team"] == "sdk"
    assert model.artifact_uri == "gs://registry-test/run1/model"
    assert model.training_pipeline == created.name
    assert list(model.version_aliases) == ["default"]
    listed = models.list_models(parent=PARENT)
    assert [m.name for m in listed] == [model_name]
    # the lineage: mtc's extension, which the SDK's messages do not carry: read it raw
    raw = requests.get(f"{server}/v1/{model_name}", headers=AUTH, timeout=10).json()
    lineage = raw["mtcLineage"]
    assert lineage["job"] == job_name and lineage["attempt"] == 1
    assert lineage["checkpointStep"] == "30", lineage
    assert lineage["inputs"]["command"][-4:] == ["--steps", "30", "--checkpoint-every", "10"]
    job = requests.get(f"{server}/v1/{job_name}", headers=AUTH, timeout=10).json()
    assert job["mtcModels"] == [f"{model_name}@1"]
    assert Path(job["mtcProgress"]["latestCheckpoint"]["path"]).name == "ckpt-00000030.npz"

    # a second version on top, through upload_model and its Operation
    op = models.upload_model(request=aip.UploadModelRequest(
        parent=PARENT, parent_model=model_name, model=aip.Model(
            display_name="sdk-model-v2", artifact_uri="gs://registry-test/run1/model")))
    result = op.result(timeout=30)
    assert result.model == model_name and result.model_version_id == "2"
    versions = list(models.list_model_versions(name=model_name))
    assert [(v.version_id, list(v.version_aliases)) for v in versions] == [
        ("1", []), ("2", ["default"])]
    assert models.get_model(name=model_name).version_id == "2"
    first = models.get_model(name=f"{model_name}@1")
    assert first.version_id == "1" and first.display_name == "sdk-model"

    with pytest.raises(exceptions.NotFound):
        models.get_model(name=f"{model_name}@7")
    models.delete_model(name=model_name).result(timeout=30)
    with pytest.raises(exceptions.NotFound):
        models.get_model(name=model_name)
    assert list(models.list_models(parent=PARENT)) == []
    assert time.monotonic() - started < 40


TUNING_TASK = ("gs://google-cloud-aiplatform/schema/trainingjob/definition/"
               "hyperparameter_tuning_task_1.0.0.yaml")


def test_tuning_task_pipeline_uploads_the_best_trial_through_the_official_sdk(server: str) -> None:
    pipelines, models = clients(server)
    program = [sys.executable, str(ROOT / "examples" / "hp_trial.py"), "--steps=6",
               "--report-every=2", "--checkpoint-every=2"]
    inputs = {
        "maxTrialCount": 3, "parallelTrialCount": 3, "maxFailedTrialCount": 1,
        "studySpec": {"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
                      "parameters": [{"parameterId": "learning_rate",
                                      "discreteValueSpec": {"values": [0.01, 0.1, 0.2]}}],
                      "algorithm": "GRID_SEARCH"},
        "trialJobSpec": {
            "persistentResourceId": "c1",
            "baseOutputDirectory": {"outputUriPrefix": "gs://registry-test/hp1"},
            "workerPoolSpecs": [{"machineSpec": {"machineType": "a3-highgpu-8g",
                                                 "acceleratorType": "NVIDIA_H100_80GB",
                                                 "acceleratorCount": 8},
                                 "replicaCount": 1,
                                 "containerSpec": {"imageUri": "local", "command": program}}]},
    }
    created = pipelines.create_training_pipeline(parent=PARENT, training_pipeline=aip.TrainingPipeline(
        display_name="sdk-hp-pipeline", training_task_definition=TUNING_TASK,
        training_task_inputs=json_format.ParseDict(inputs, struct_pb2.Value()),
        model_to_upload=aip.Model(display_name="sdk-hp-model")))
    tuning_job = created.training_task_metadata["backingHyperparameterTuningJob"]
    assert tuning_job.startswith(f"{PARENT}/hyperparameterTuningJobs/")
    deadline = time.monotonic() + 60
    while True:
        got = pipelines.get_training_pipeline(name=created.name)
        if got.state in (aip.PipelineState.PIPELINE_STATE_SUCCEEDED,
                         aip.PipelineState.PIPELINE_STATE_FAILED):
            break
        assert time.monotonic() < deadline, got.state
        time.sleep(0.3)
    assert got.state == aip.PipelineState.PIPELINE_STATE_SUCCEEDED, got.error
    study = requests.get(f"{server}/v1/{tuning_job}", headers=AUTH, timeout=10).json()
    assert study["state"] == "JOB_STATE_SUCCEEDED" and len(study["trials"]) == 3
    best = min(study["trials"], key=lambda t: t["finalMeasurement"]["metrics"][0]["value"])
    assert got.training_task_metadata["bestTrial"] == best["id"]
    raw = requests.get(f"{server}/v1/{got.model_to_upload.name}", headers=AUTH, timeout=10).json()
    lineage = raw["mtcLineage"]
    assert lineage["job"] == best["customJob"] and lineage["trial"] == best["id"]
    assert lineage["tuningJob"] == tuning_job and lineage["attempt"] == 1
    assert lineage["checkpointStep"] == "6", lineage
    model = models.get_model(name=got.model_to_upload.name)
    assert model.artifact_uri == f"gs://registry-test/hp1/{best['id']}/model"
    assert model.training_pipeline == created.name
    models.delete_model(name=model.name).result(timeout=30)
