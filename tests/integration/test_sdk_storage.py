"""The Vertex AI SDK's own staging to Cloud Storage, unchanged, against a live ``mtc serve``
with only ``STORAGE_EMULATOR_HOST`` exported (the line `mtc serve` prints):
``CustomJob.from_local_script`` and ``CustomTrainingJob`` package a script of their own
(importing nothing of mtc), upload it to the staging bucket with google-cloud-storage and run
it to SUCCEEDED;
google-cloud-storage uploads, lists and downloads; ``Model.upload`` takes a ``gs://``
artifact the client put there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.cloud import aiplatform, storage
from google.cloud.aiplatform import jobs, training_jobs
from google.oauth2.credentials import Credentials

from tests.serving import create_cluster, mtc_serve

TOKEN = "storage-sdk-admin-token"
PARENT = "projects/p/locations/us-central1"  # the high-level SDK checks the region's name
IMAGE = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"
pytestmark = pytest.mark.integration

SCRIPT = """\
import os
import sys

print("plain script says", " ".join(sys.argv[1:]), "in", os.environ["CLOUD_ML_JOB_ID"])
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("storage") / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        op = create_cluster(url, TOKEN, "c1", parent=PARENT, workers=1)
        assert "error" not in op, op
        yield url, state


def test_sdk_stages_through_mtcs_cloud_storage(server: tuple[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url, state = server
    serve_log = next(state.parent.glob("serve-*.log")).read_text()
    assert f"export STORAGE_EMULATOR_HOST={url}" in serve_log  # the line a user copies
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    for module in (jobs, training_jobs):  # the SDK polls every 5 s otherwise
        monkeypatch.setattr(module, "_JOB_WAIT_TIME", 0.5)
    creds = Credentials(token=TOKEN)  # type: ignore[no-untyped-call]

    gcs = storage.Client(project="p", credentials=creds)
    gcs.create_bucket("stage-bkt")  # as on Google Cloud: the staging bucket exists first
    blob = gcs.bucket("stage-bkt").blob("data/input.txt")
    blob.upload_from_string(b"12345")
    big = os.urandom(9 << 20)  # past the client's 8 MiB: a resumable upload
    gcs.bucket("stage-bkt").blob("data/big.bin").upload_from_string(big)
    assert gcs.bucket("stage-bkt").blob("data/big.bin").download_as_bytes() == big
    listed = gcs.list_blobs("stage-bkt", prefix="data/")
    assert [b.name for b in listed] == ["data/big.bin", "data/input.txt"]
    assert (state / "jobs" / "gcs" / "stage-bkt" / "data" / "input.txt").read_bytes() == b"12345"

    aiplatform.init(project="p", location="us-central1", api_endpoint=url, api_transport="rest",
                    credentials=creds, staging_bucket="gs://stage-bkt/staging")
    script = tmp_path / "task.py"
    script.write_text(SCRIPT)
    job = aiplatform.CustomJob.from_local_script(
        display_name="local-script", script_path=str(script), container_uri=IMAGE,
        args=["hello"], machine_type="a3-highgpu-8g", accelerator_type="NVIDIA_H100_80GB",
        accelerator_count=8, persistent_resource_id="c1",
        credentials=creds)  # the storage client sends no token without it (the 401 says so)
    job.run()
    assert job.state == aiplatform.gapic.JobState.JOB_STATE_SUCCEEDED
    [package] = job.job_spec.worker_pool_specs[0].python_package_spec.package_uris
    assert package.startswith("gs://stage-bkt/staging/aiplatform-")
    job_id = job.resource_name.rsplit("/", 1)[1]
    logs = "\n".join(p.read_text() for p in (state / "compute" / "logs").glob(f"*{job_id}*/*.log"))
    assert "plain script says hello" in logs, logs[-2000:]

    # CustomTrainingJob stages with aiplatform.init's credentials itself
    pipeline = aiplatform.CustomTrainingJob(display_name="training-job", script_path=str(script),
                                            container_uri=IMAGE)
    pipeline.run(args=["again"], machine_type="a3-highgpu-8g",
                 accelerator_type="NVIDIA_H100_80GB", accelerator_count=8,
                 persistent_resource_id="c1", base_output_dir="gs://stage-bkt/training")
    assert pipeline.state == aiplatform.gapic.PipelineState.PIPELINE_STATE_SUCCEEDED
    logs = "\n".join(p.read_text() for p in (state / "compute" / "logs").glob("*/*.log"))
    assert "plain script says again" in logs, logs[-2000:]

    gcs.bucket("stage-bkt").blob("model/model.txt").upload_from_string(b"weights")
    model = aiplatform.Model.upload(display_name="m", artifact_uri="gs://stage-bkt/model",
                                    serving_container_image_uri="us-docker.pkg.dev/vertex-ai/"
                                    "prediction/sklearn-cpu.1-0:latest")
    assert model.uri == "gs://stage-bkt/model"
