"""Schemathesis against a live ``mtc serve``: every operation of the served OpenAPI document,
with generated valid (positive) and invalid (negative) requests, must never answer 5xx and
must answer with a status, content type and body the document declares.

The document is loaded from the running server's ``/openapi.json``. Each operation runs
twice: with every path parameter generated (mostly 400s and 404s), and with the project,
location and resource id pinned to live resources (a cluster, a running job, the cluster's
create Operation) so that 200s, with real bodies, are checked against the response schemas
too; DELETE keeps a generated id so it never removes what the others read. The cases are
generated deterministically (``derandomize``), a bounded number per operation, and every
failure of an operation is collected (with a curl line to replay it) before the test fails.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.schemas import BaseSchema

from services.api.http import ROUTES
from services.api.openapi import document
from tests.serving import PARENT, create_cluster, mtc_serve

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOKEN = "schemathesis-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# derandomized: the same cases every run; more found nothing new. A negative case costs
# several times a positive one (hypothesis discards most of what it draws before it finds
# something invalid), so fewer of them
MAX_EXAMPLES = {GenerationMode.POSITIVE: 12, GenerationMode.NEGATIVE: 6}
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          content_type_conformance]
CLUSTER, JOB = "st-cluster", "st-job"
MODEL, PIPELINE = "st-model", "st-pipeline"
TUNING = "st-hpt"
ENDPOINT = "st-endpoint"
CUSTOM_TASK = "gs://google-cloud-aiplatform/schema/trainingjob/definition/custom_task_1.0.0.yaml"


def _cases() -> list[Any]:
    """(method, path, mode, pinned) for every operation; a negative run needs something
    left to get wrong, so an operation with pinned path, no query and no body has none (a
    DELETE pins only the project and location, so its negative run is the unpinned one)."""
    out = []
    for path, item in document(ROUTES)["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            for pinned in (False, True):
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    negatable = (("parameters" in op or "requestBody" in op) and method != "delete") \
                        or not pinned
                    if mode is GenerationMode.POSITIVE or negatable:
                        version, tail = path.split("/projects/{project}/locations/{location}/")
                        out.append(pytest.param(
                            method.upper(), path, mode, pinned,
                            id=f"{method.upper()} {version[1:]} {tail} {mode.value}"
                               f"{' live' if pinned else ''}"))
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[str, BaseSchema, dict[str, str]]]:
    state = Path(tmp_path_factory.mktemp("schemathesis")) / "state"
    with mtc_serve(state, TOKEN) as url:
        op = create_cluster(url, TOKEN, CLUSTER, workers=1)
        job: dict[str, Any] = {"displayName": "sleeper", "jobSpec": {
            "persistentResourceId": CLUSTER, "workerPoolSpecs": [{
                "machineSpec": {"machineType": "a3-highgpu-8g",
                                "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
                "replicaCount": "1",
                "containerSpec": {"imageUri": "local", "command": [
                    sys.executable, "-c", "import time; time.sleep(120)"]}}]}}
        created = requests.post(f"{url}/v1/{PARENT}/customJobs", params={"customJobId": JOB},
                                json=job, headers=AUTH, timeout=30)
        assert created.status_code == 200, created.text
        uploaded = requests.post(f"{url}/v1/{PARENT}/models:upload", json={
            "model": {"displayName": "st"}, "modelId": MODEL}, headers=AUTH, timeout=30)
        assert uploaded.status_code == 200, uploaded.text
        pipeline = requests.post(f"{url}/v1/{PARENT}/trainingPipelines", params={
            "trainingPipelineId": PIPELINE}, json={
            "displayName": "st", "trainingTaskDefinition": CUSTOM_TASK,
            "trainingTaskInputs": job["jobSpec"]}, headers=AUTH, timeout=30)
        assert pipeline.status_code == 200, pipeline.text
        tuning = requests.post(f"{url}/v1/{PARENT}/hyperparameterTuningJobs", params={
            "hyperparameterTuningJobId": TUNING}, json={
            "displayName": "st", "maxTrialCount": 1, "parallelTrialCount": 1,
            "studySpec": {"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}], "parameters": [
                {"parameterId": "x", "discreteValueSpec": {"values": [1]}}]},
            "trialJobSpec": job["jobSpec"]}, headers=AUTH, timeout=30)
        assert tuning.status_code == 200, tuning.text
        endpoint = requests.post(f"{url}/v1/{PARENT}/endpoints", params={
            "endpointId": ENDPOINT}, json={"displayName": "st"}, headers=AUTH, timeout=30)
        assert endpoint.status_code == 200, endpoint.text
        project, location = PARENT.split("/")[1::2]
        known = {"project": project, "location": location, "customJob": JOB,
                 "modelDevelopmentCluster": CLUSTER, "operation": op["name"].rsplit("/", 1)[1],
                 "model": MODEL, "trainingPipeline": PIPELINE,
                 "hyperparameterTuningJob": TUNING, "endpoint": ENDPOINT,
                 "node": f"{CLUSTER}-gpu-000"}  # a worker of CLUSTER (tests/serving.py's pool)
        yield url, schemathesis.openapi.from_url(f"{url}/openapi.json", headers=AUTH), known


def _report(case: Case[Any], response: Any, error: BaseException, url: str) -> str:
    """Schemathesis's own failure text names the check, the response and a curl line."""
    if isinstance(error, BaseExceptionGroup):
        return str(error)
    status = response.status_code if response is not None else "no response"
    return (f"{case.method} {case.formatted_path} -> {status}: {error}\n"
            f"  replay: {case.as_curl_command(headers=AUTH, base_url=url)}")


@pytest.mark.parametrize(("method", "path", "mode", "pinned"), _cases())
def test_operation_conforms_to_the_document(
        live: tuple[str, BaseSchema, dict[str, str]], method: str, path: str,
        mode: GenerationMode, pinned: bool) -> None:
    url, schema, known = live
    operation = schema[path][method]
    names = [p.name for p in operation.path_parameters]
    fixed = {n: known[n] for n in names if method != "DELETE" or n in ("project", "location")
             } if pinned else {}
    failures: list[str] = []
    count = [0]
    session = requests.Session()

    @given(case=operation.as_strategy(generation_mode=mode, headers=AUTH,
                                       path_parameters=fixed))
    @settings(max_examples=MAX_EXAMPLES[mode], deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    def run(case: Case[Any]) -> None:
        response = None
        try:
            response = case.call(base_url=url, session=session, headers=AUTH, timeout=30)
            case.validate_response(response, checks=CHECKS, headers=AUTH)
        except (AssertionError, BaseExceptionGroup, requests.RequestException) as exc:
            count[0] += 1
            if len(failures) < 5:
                failures.append(_report(case, response, exc, url))

    run()
    assert not failures, (f"{count[0]} of the generated cases failed; the first "
                          f"{len(failures)}:\n\n" + "\n\n".join(failures))
