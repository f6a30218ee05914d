"""The official Vertex AI SDK (``google.cloud.aiplatform``, REST)
submits a ``pythonPackageSpec`` CustomJob on a prebuilt PyTorch image URI to a live
``mtc serve``. The package is a wheel built here of a tiny trainer (examples/torch_ddp.py as
``trainer.task``), put in the ``gs://`` tree; mtc maps the image to its local PyTorch runtime,
installs the wheel into a per-job environment and runs 2 nodes x 2 ranks of ``torch.distributed``
through an injected XID 79 to SUCCEEDED."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.cloud import aiplatform
from google.oauth2.credentials import Credentials

from tests.serving import ROOT, create_cluster, mtc_serve

TOKEN = "torch-sdk-admin-token"
pytestmark = [pytest.mark.integration, pytest.mark.slow]
H = {"Authorization": f"Bearer {TOKEN}"}
IMAGE = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"
PARENT = "projects/p/locations/us-central1"  # the high-level SDK checks the region's name


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("torch") / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        op = create_cluster(url, TOKEN, "c1", parent=PARENT, workers=3)  # a spare for the faulty node's ranks
        assert "error" not in op, op
        yield url, state


def build_wheel(directory: Path) -> Path:
    """A wheel (PEP 427) of package ``trainer`` whose ``task`` module is torch_ddp.py."""
    files = {
        "trainer/__init__.py": "",
        "trainer/task.py": (ROOT / "examples" / "torch_ddp.py").read_text(),
        "trainer-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: trainer\n"
                                          "Version: 0.1\nRequires-Dist: torch\n",
        "trainer-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                       "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(text: str) -> str:
        raw = hashlib.sha256(text.encode()).digest()
        return f"sha256={base64.urlsafe_b64encode(raw).rstrip(b'=').decode()},{len(text.encode())}"

    record = "".join(f"{name},{digest(text)}\n" for name, text in files.items())
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "trainer-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("trainer-0.1.dist-info/RECORD", record + "trainer-0.1.dist-info/RECORD,,\n")
    return wheel


def pool(args: list[str]) -> dict[str, Any]:
    return {
        "machine_spec": {"machine_type": "a3-highgpu-8g", "accelerator_type": "NVIDIA_H100_80GB",
                         "accelerator_count": 8},
        "replica_count": 1,
        "python_package_spec": {
            "executor_image_uri": IMAGE,
            "package_uris": ["gs://bkt/pkgs/trainer-0.1-py3-none-any.whl"],
            "python_module": "trainer.task",
            "args": args,
            # two processes per replica on this CPU machine (a GPU image: one per GPU)
            "env": [{"name": "MTC_PROCESSES_PER_NODE", "value": "2"}]}}


def rest_job(url: str, name: str) -> dict[str, Any]:
    resp = requests.get(f"{url}/v1/{name}", headers=H, timeout=30)
    resp.raise_for_status()
    return resp.json()  # type: ignore[no-any-return]


def test_sdk_python_package_on_a_prebuilt_pytorch_image_heals_through_xid(
        server: tuple[str, Path]) -> None:
    url, state = server
    build_wheel(state / "jobs" / "gcs" / "bkt" / "pkgs")  # gs://bkt/pkgs on the embedded default
    aiplatform.init(project="p", location="us-central1", api_endpoint=url, api_transport="rest",
                    credentials=Credentials(token=TOKEN))  # type: ignore[no-untyped-call]
    args = ["--steps", "150", "--checkpoint-every", "5", "--step-time", "0.1"]
    job = aiplatform.CustomJob(display_name="ddp-package", worker_pool_specs=[pool(args)] * 2,
                               base_output_dir="gs://bkt/out", staging_bucket="gs://bkt/staging")
    job.submit(persistent_resource_id="c1", restart_job_on_worker_restart=False)
    name = job.resource_name
    assert name.startswith(f"{PARENT}/customJobs/")

    # once it runs and has checkpointed, an XID 79 on the primary replica's node
    deadline = time.monotonic() + 150
    while True:
        got = rest_job(url, name)
        assert got["state"] not in ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"), got
        progress = got.get("mtcProgress", {})
        if got["state"] == "JOB_STATE_RUNNING" and progress.get("latestCheckpoint"):
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.3)
    node = progress["nodes"][0]
    fault = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "--state-dir", str(state), "node", "fault",
         node, "--xid", "79"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert fault.returncode == 0, fault.stderr

    deadline = time.monotonic() + 200
    while job.state not in (aiplatform.gapic.JobState.JOB_STATE_SUCCEEDED,
                            aiplatform.gapic.JobState.JOB_STATE_FAILED):
        assert time.monotonic() < deadline, rest_job(url, name)
        time.sleep(0.5)
    healed = rest_job(url, name)
    job_id = name.rsplit("/", 1)[1]
    logs = "\n".join(p.read_text() for p in sorted(
        (state / "compute" / "logs").glob(f"*{job_id}*/*.log")))
    assert job.state == aiplatform.gapic.JobState.JOB_STATE_SUCCEEDED, (healed, logs[-3000:])
    assert int(healed["mtcProgress"]["restartCount"]) >= 1
    assert node not in healed["mtcProgress"]["nodes"]  # moved off the faulty node
    # 4 ranks of one process group, resumed from a checkpoint, finished every step
    assert "resumed from step" in logs
    assert all(f"rank {r}: done at step 150" in logs for r in range(4)), logs[-3000:]
    assert (state / "jobs" / "gcs" / "bkt" / "out" / "model" / "model.pt").is_file()
    # the package went into a cached per-job environment over the PyTorch runtime
    # (as root each job's uid has a cache of its own, runtimes/by-uid/<uid>: docs/security.md)
    [runtimes] = [d for d in (state / "runtimes", *(state / "runtimes" / "by-uid").glob("*"))
                  if (d / "runtime-pytorch").is_dir()]
    assert (runtimes / "runtime-pytorch" / "framework-version").read_text().startswith("2.")
    assert len(list(runtimes.glob("env-*"))) == 1
