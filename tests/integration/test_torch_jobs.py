"""PyTorch jobs under mtc's local compute: examples/torch_ddp.py on 2 nodes x 2 processes
(``torch.distributed.run`` per node, gloo on CPU), to success; and a pythonPackageSpec whose
package pip cannot install fails with pip's last lines. (A SIGKILLed rank ending the gang,
which restarts and resumes: tests/integration/test_demo_torch.py.)"""

from __future__ import annotations

import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.api.http import create_app
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.serving import PARENT, vertex_pools
from tests.unit.api.conftest import TOKEN, Api, one_pass_config

pytestmark = pytest.mark.slow  # real torch.distributed processes

ROOT = Path(__file__).resolve().parents[2]
JOBS = f"/v1/{PARENT}/customJobs"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    yield Api(create_app(ctx).test_client(), app)
    app.compute.kill_all()
    app.close()


def torch_job(args: list[str], *, restart: bool = False) -> dict[str, Any]:
    """torch_ddp.py on 2 replicas (pool 0 + pool 1), 2 processes each: 4 ranks."""
    pool = {"machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                            "acceleratorCount": 8},
            "containerSpec": {"imageUri": "local", "command": [
                sys.executable, str(ROOT / "examples" / "torch_ddp.py"), *args],
                "env": [{"name": "MTC_PROCESSES_PER_NODE", "value": "2"}]}}
    return {"displayName": "ddp", "jobSpec": {
        "persistentResourceId": "c1", "workerPoolSpecs": vertex_pools(pool, 2),
        "scheduling": {"restartJobOnWorkerRestart": restart},
        "baseOutputDirectory": {"outputUriPrefix": "gs://bucket/ddp"}}}


def until(api: Api, job_id: str, predicate: Any, timeout: float = 150.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        api.app.pump(budget_s=0.3)
        job: dict[str, Any] = api.call("GET", f"{JOBS}/{job_id}").json
        if predicate(job):
            return job
        assert time.monotonic() < deadline, f"{job}\n{logs(api, job_id)[-4000:]}"
        time.sleep(0.1)


def logs(api: Api, job_id: str) -> str:
    folder = api.app.compute.state_dir / "logs" / job_id
    return "\n".join(p.read_text() for p in sorted(folder.glob("*.log")))


def output(api: Api, *parts: str) -> Path:
    return Path(api.app.deps.config.output_root, "gcs", "bucket", "ddp", *parts)


def test_torch_ddp_runs_2_nodes_x_2_processes_to_success(api: Api) -> None:
    api.cluster(workers=2)
    assert api.call("POST", f"{JOBS}?customJobId=t1", torch_job(["--steps", "12"])
                    ).status_code == 200
    job = until(api, "t1", lambda j: j["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    text = logs(api, "t1")
    assert job["state"] == "JOB_STATE_SUCCEEDED", text[-3000:]
    # 4 ranks in one process group: each rank says it finished, rank 3 on the second node
    assert all(f"rank {r}: done at step 12" in text for r in range(4)), text[-3000:]
    assert (output(api, "model", "model.pt")).is_file()
    assert sorted(p.name for p in output(api, "checkpoints").glob("ckpt-*.pt")) == [
        "ckpt-00000010.pt"]


def test_a_package_pip_cannot_install_fails_the_job_with_pips_last_lines(api: Api) -> None:
    api.cluster(workers=2)
    pkgs = output(api).parent / "pkgs"  # gs://bucket/pkgs
    pkgs.mkdir(parents=True)
    with zipfile.ZipFile(pkgs / "bad-0.1-py3-none-any.whl", "w") as z:
        z.writestr("bad/__init__.py", "")
        z.writestr("bad-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: bad\n"
                   "Version: 0.1\nRequires-Dist: no-such-dependency-here\n")
        z.writestr("bad-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("bad-0.1.dist-info/RECORD", "")
    pool = {"machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                            "acceleratorCount": 8}, "replicaCount": 1,
            "pythonPackageSpec": {"executorImageUri": "gcr.io/me/python:3",  # a custom image
                                  "packageUris": ["gs://bucket/pkgs/bad-0.1-py3-none-any.whl"],
                                  "pythonModule": "bad"}}
    body = {"displayName": "bad", "jobSpec": {"persistentResourceId": "c1",
                                              "workerPoolSpecs": [pool]}}
    assert api.call("POST", f"{JOBS}?customJobId=t3", body).status_code == 200
    job = until(api, "t3", lambda j: j["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"))
    assert job["state"] == "JOB_STATE_FAILED"
    assert "no-such-dependency-here" in job["error"]["message"], job["error"]
    assert "pip could not install" in job["error"]["message"]
