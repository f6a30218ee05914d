"""Issue: destructive updates. Shrinking a cluster below what a running job needs, or
deleting a cluster under a running job, is refused unless forced; forced means SIGTERM, the
grace period and a checkpoint before the change, never a SIGKILL without one."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.serving import PARENT, cluster_body, vertex_pools
from tests.unit.api.conftest import Api

pytestmark = pytest.mark.slow  # real training workers (examples/train.py) run to the end

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
JOBS = f"/v1/{PARENT}/customJobs"


def train_job(replicas: int) -> dict[str, Any]:
    return {"displayName": "train", "jobSpec": {"persistentResourceId": "c1",
                                                "workerPoolSpecs": vertex_pools({
        "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                        "acceleratorCount": 8},
        "containerSpec": {"imageUri": "local", "command": [
            sys.executable, str(ROOT / "examples" / "train.py")],
            "args": ["--steps", "100000", "--checkpoint-every", "5", "--step-time", "0.02"]}},
        replicas)}}


def running_job(api: Api, replicas: int) -> dict[str, Any]:
    assert api.call("POST", f"{JOBS}?customJobId=j1", train_job(replicas)).status_code == 200
    return api.until(lambda: (j := api.call("GET", f"{JOBS}/j1").json)["state"]  # type: ignore[no-any-return]
                 == "JOB_STATE_RUNNING" and j.get("mtcProgress", {}).get("latestCheckpoint")
                 and j)


def resized(workers: int) -> dict[str, Any]:
    return cluster_body(workers=workers)


def test_destructive_updates_are_refused_unless_forced(api: Api) -> None:
    api.cluster(workers=2)
    running_job(api, replicas=2)
    refused = api.call("PATCH", CLUSTER, resized(1))
    assert refused.status_code == 400
    assert refused.json["error"]["status"] == "FAILED_PRECONDITION"
    assert "j1" in refused.json["error"]["message"] and "force" in refused.json["error"]["message"]
    assert api.call("GET", CLUSTER).json["mtcNodes"]["total"] == 2  # nothing changed
    assert api.call("GET", f"{JOBS}/j1").json["state"] == "JOB_STATE_RUNNING"

    forced = api.call("PATCH", f"{CLUSTER}?force=true", resized(1))
    assert forced.status_code == 200, forced.json
    job = api.until(lambda: (j := api.call("GET", f"{JOBS}/j1").json)["state"]
                == "JOB_STATE_CANCELLED" and j)
    assert "resized" in job["error"]["message"] or job["error"]["code"] == 1
    done = api.call("POST", f"/v1beta1/{forced.json['name']}:wait", {"timeout": "20s"}).json
    assert done["done"] and done["response"]["mtcNodes"]["total"] == 1
    # a new 1-node job runs on what is left: nothing waits forever behind the old one
    small = train_job(1)
    small["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"] = ["--steps", "5",
                                                                      "--step-time", "0.01"]
    assert api.call("POST", f"{JOBS}?customJobId=j2", small).status_code == 200
    api.until(lambda: api.call("GET", f"{JOBS}/j2").json["state"] == "JOB_STATE_SUCCEEDED")


def test_delete_under_a_running_job_is_refused_unless_forced(api: Api) -> None:
    api.cluster(workers=2)
    before = running_job(api, replicas=1)
    refused = api.call("DELETE", CLUSTER)
    assert refused.status_code == 400
    assert refused.json["error"]["status"] == "FAILED_PRECONDITION"
    assert api.call("GET", CLUSTER).json["state"] == "READY"
    time.sleep(0.3)  # some 15 steps past the last periodic checkpoint
    forced = api.call("DELETE", f"{CLUSTER}?force=true")
    assert forced.status_code == 200, forced.json
    api.until(lambda: api.call("POST", f"/v1beta1/{forced.json['name']}:wait",
                                {"timeout": "5s"}).json["done"])
    job = api.call("GET", f"{JOBS}/j1").json
    assert job["state"] == "JOB_STATE_CANCELLED"
    step_before = int(before["mtcProgress"]["latestCheckpoint"]["step"])
    step_after = int(job["mtcProgress"]["latestCheckpoint"]["step"])
    assert step_after > step_before  # it checkpointed on SIGTERM before the machines went
    exits = [d for d in api.app.deps.event_log.read() if d["type"] == "mtc.job.workers_exited.v1"]
    assert [d["data"]["exit_code"] for d in exits] == [75]  # preempted with a checkpoint
