"""The official Vertex AI SDK (google-cloud-aiplatform, REST transport), unchanged, against a
running `mtc serve`: the claim that mtc speaks the Vertex API holds only if this passes."""

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
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1 as aip
from google.oauth2.credentials import Credentials

from services.api.tokens import LocalTokens
from tests.serving import PARENT, create_cluster, mtc_serve

TOKEN = "sdk-test-admin-token"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("sdk") / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        op = create_cluster(url, TOKEN, "c1")
        assert "error" not in op, op
        assert op["response"]["state"] == "READY"
        yield url, state


class NoCredentials(AnonymousCredentials):  # type: ignore[misc]
    """Sends no Authorization header; a 401's refresh does nothing, so the SDK surfaces it."""

    def refresh(self, request: Any) -> None:
        return None


def client(url: str, token: str | None = TOKEN) -> aip.JobServiceClient:
    creds: Any = Credentials(token=token) if token else NoCredentials()
    return aip.JobServiceClient(transport="rest", credentials=creds,
                                client_options=ClientOptions(api_endpoint=url))


def job(name: str, code: str, *, timeout_s: int | None = None) -> aip.CustomJob:
    scheduling = aip.Scheduling(timeout=f"{timeout_s}s") if timeout_s else None
    return aip.CustomJob(
        display_name=name,
        labels={"team": "sdk"},
        job_spec=aip.CustomJobSpec(
            persistent_resource_id="c1",
            scheduling=scheduling,
            worker_pool_specs=[aip.WorkerPoolSpec(
                machine_spec=aip.MachineSpec(machine_type="a3-highgpu-8g",
                                             accelerator_type=aip.AcceleratorType.NVIDIA_H100_80GB,
                                             accelerator_count=8),
                replica_count=1,
                container_spec=aip.ContainerSpec(image_uri="local",
                                                 command=[sys.executable, "-c", code]))]))


def wait_state(c: aip.JobServiceClient, name: str, states: set[Any], timeout: float = 60
               ) -> aip.CustomJob:
    deadline = time.monotonic() + timeout
    while True:
        got = c.get_custom_job(name=name)
        if got.state in states:
            return got
        assert time.monotonic() < deadline, f"{name} stuck in {got.state.name}"
        time.sleep(0.3)


def test_jobs_through_the_official_sdk(server: tuple[str, Path]) -> None:
    url, _ = server
    c = client(url)
    short = c.create_custom_job(parent=PARENT, custom_job=job("short", "print('hello')"))
    long = c.create_custom_job(parent=PARENT, custom_job=job(
        "long", "import time\nfor _ in range(600): time.sleep(1)", timeout_s=3600))
    assert short.name.startswith(f"{PARENT}/customJobs/")
    assert short.labels["team"] == "sdk"
    assert short.job_spec.worker_pool_specs[0].replica_count == 1
    assert long.job_spec.scheduling.timeout.total_seconds() == 3600

    done = wait_state(c, short.name, {aip.JobState.JOB_STATE_SUCCEEDED,
                                      aip.JobState.JOB_STATE_FAILED})
    assert done.state == aip.JobState.JOB_STATE_SUCCEEDED, done.error
    assert done.end_time and done.start_time

    pager = c.list_custom_jobs(request=aip.ListCustomJobsRequest(parent=PARENT, page_size=1))
    pages = list(pager.pages)
    assert [len(p.custom_jobs) for p in pages] == [1, 1]
    assert pages[0].next_page_token and not pages[-1].next_page_token
    assert {j.name for p in pages for j in p.custom_jobs} == {short.name, long.name}
    only_done = c.list_custom_jobs(request=aip.ListCustomJobsRequest(
        parent=PARENT, filter='state="JOB_STATE_SUCCEEDED" AND labels.team="sdk"'))
    assert [j.name for j in only_done] == [short.name]

    wait_state(c, long.name, {aip.JobState.JOB_STATE_RUNNING})
    c.cancel_custom_job(name=long.name)
    cancelled = wait_state(c, long.name, {aip.JobState.JOB_STATE_CANCELLED})
    assert cancelled.error.code == 1

    operation = c.delete_custom_job(name=short.name)
    operation.result(timeout=30)
    with pytest.raises(exceptions.NotFound):
        c.get_custom_job(name=short.name)


def test_errors_the_sdk_raises(server: tuple[str, Path]) -> None:
    url, state = server
    with pytest.raises(exceptions.Unauthorized) as no_token:
        client(url, token=None).list_custom_jobs(parent=PARENT)
    assert no_token.value.response.json()["error"]["status"] == "UNAUTHENTICATED"

    viewer = LocalTokens(state / "api-tokens.json").create("token:viewer", "viewer", "p")
    assert list(client(url, viewer).list_custom_jobs(parent=PARENT)) is not None
    with pytest.raises(exceptions.Forbidden) as denied:
        client(url, viewer).create_custom_job(parent=PARENT, custom_job=job("x", "pass"))
    assert denied.value.response.json()["error"]["status"] == "PERMISSION_DENIED"
    assert "aiplatform.customJobs.create" in denied.value.message

    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"displayName": "typo", "jobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": [
        {"machineSpec": {"machineType": "n2"}, "replicaCont": 2,
         "containerSpec": {"imageUri": "x", "command": ["true"]}}]}}
    resp = requests.post(f"{url}/v1/{PARENT}/customJobs", json=body, headers=headers, timeout=10)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    violation = error["details"][0]["fieldViolations"][0]
    assert violation["field"] == "jobSpec.workerPoolSpecs[0].replicaCont"

    typo = aip.CustomJob(display_name="bad", job_spec=aip.CustomJobSpec(
        persistent_resource_id="c1", worker_pool_specs=[aip.WorkerPoolSpec(
            machine_spec=aip.MachineSpec(machine_type="n2"), replica_count=1,
            container_spec=aip.ContainerSpec(image_uri="gcr.io/x/y"))]))
    with pytest.raises(exceptions.BadRequest) as image_only:
        client(url).create_custom_job(parent=PARENT, custom_job=typo)
    assert "containerSpec.command" in image_only.value.message
