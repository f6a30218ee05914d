"""A job's ``AIP_*_DIR`` are Vertex's ``gs://`` URIs and its objects are at ``/gcs/``: a plain
program (importing nothing of mtc) run by a root ``mtc serve`` (so in its sandbox) is told
``gs://BUCKET/PATH/model/``, writes its model where a Vertex program does
(``AIP_MODEL_DIR.replace("gs://", "/gcs/")``), and the object is then read back through
mtc's Cloud Storage JSON API and found in the host's ``gcs/`` tree."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.serving import PARENT, create_cluster, mtc_serve, wait_until

pytestmark = pytest.mark.integration

TOKEN = "admin-" + secrets.token_hex(16)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}

# what a Vertex program does with its directories: it imports nothing of mtc
PLAIN = """
import json, os
told = {n: os.environ[n] for n in ("AIP_MODEL_DIR", "AIP_CHECKPOINT_DIR",
                                    "AIP_TENSORBOARD_LOG_DIR")}
model = told["AIP_MODEL_DIR"].replace("gs://", "/gcs/")
ckpt = told["AIP_CHECKPOINT_DIR"].replace("gs://", "/gcs/")
os.makedirs(model, exist_ok=True)
with open(os.path.join(ckpt, "ckpt-7.txt"), "w") as f:
    f.write("step 7")
with open(os.path.join(model, "model.json"), "w") as f:
    json.dump({"told": told, "model_path": model, "uid": os.getuid()}, f)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("gcsdirs") / "state"
    with mtc_serve(state, TOKEN) as url:
        create_cluster(url, TOKEN, workers=1)
        yield url, state


def _run(url: str, command: list[str], prefix: str) -> dict[str, Any]:
    pool: dict[str, Any] = {
        "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                        "acceleratorCount": 8},
        "replicaCount": "1", "containerSpec": {"imageUri": "local", "command": command}}
    body = {"displayName": "gcs-dirs", "jobSpec": {
        "persistentResourceId": "c1", "workerPoolSpecs": [pool],
        "baseOutputDirectory": {"outputUriPrefix": prefix}}}
    made = requests.post(f"{url}/v1/{PARENT}/customJobs", json=body, headers=HEADERS, timeout=30)
    assert made.status_code == 200, made.text
    name = made.json()["name"]

    def ended() -> dict[str, Any] | None:
        job = requests.get(f"{url}/v1/{name}", headers=HEADERS, timeout=30).json()
        return job if job.get("state") in TERMINAL else None

    return wait_until(f"{name} to end", ended, timeout_s=90, interval_s=0.3)  # type: ignore[no-any-return]


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0
                    or os.environ.get("MTC_SANDBOX", "").lower() == "off",
                    reason="/gcs/ is mounted in a job's sandbox: a root server's jobs only")
def test_a_plain_program_writes_its_gs_model_dir_at_gcs(served: tuple[str, Path]) -> None:
    url, state = served
    job = _run(url, [sys.executable, "-c", PLAIN], "gs://gcs-dirs-bkt/runs/r1")
    assert job["state"] == "JOB_STATE_SUCCEEDED", job

    got = requests.get(f"{url}/storage/v1/b/gcs-dirs-bkt/o/runs%2Fr1%2Fmodel%2Fmodel.json",
                       params={"alt": "media"}, headers=HEADERS, timeout=30)
    assert got.status_code == 200, got.text
    seen = json.loads(got.content)
    assert seen["told"] == {"AIP_MODEL_DIR": "gs://gcs-dirs-bkt/runs/r1/model/",
                            "AIP_CHECKPOINT_DIR": "gs://gcs-dirs-bkt/runs/r1/checkpoints/",
                            "AIP_TENSORBOARD_LOG_DIR": "gs://gcs-dirs-bkt/runs/r1/logs/"}
    assert seen["model_path"] == "/gcs/gcs-dirs-bkt/runs/r1/model/"
    assert seen["uid"] != 0  # it ran in the sandbox, as the job's own uid
    host = state / "jobs" / "gcs" / "gcs-dirs-bkt" / "runs" / "r1"
    assert json.loads((host / "model" / "model.json").read_text()) == seen
    assert (host / "checkpoints" / "ckpt-7.txt").read_text() == "step 7"
    # both are objects of the bucket, as on Vertex
    listed = requests.get(f"{url}/storage/v1/b/gcs-dirs-bkt/o", params={"prefix": "runs/r1/"},
                          headers=HEADERS, timeout=30).json()
    names = {o["name"] for o in listed.get("items", [])}
    assert {"runs/r1/model/model.json", "runs/r1/checkpoints/ckpt-7.txt"} <= names, names
