"""Team queues through the API on the embedded default: ``mtcQueues`` on the cluster is
validated by field, stored and shown; a job names its team with the ``mtc-team`` label. Team
a's real training job borrows b's idle node and gives it back by preemption when b submits
(SIGTERM, a checkpoint, requeued); the waiting job's ``mtcProgress.queue`` says where it
stands and why."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.serving import PARENT, cluster_body, vertex_pools
from tests.unit.api.conftest import Api

ROOT = Path(__file__).resolve().parents[3]
CLUSTERS = f"/v1beta1/{PARENT}/modelDevelopmentClusters"
JOBS = f"/v1/{PARENT}/customJobs"
QUEUES = [{"team": "a", "partition": "gpu", "nominalNodes": 1},
          {"team": "b", "partition": "gpu", "nominalNodes": 1, "borrowingLimitNodes": 0}]


def queued_cluster(queues: list[dict[str, Any]]) -> dict[str, Any]:
    body = cluster_body(workers=2)
    body["mtcQueues"] = queues
    return body


def team_job(team: str, replicas: int) -> dict[str, Any]:
    return {"displayName": f"train-{team}", "labels": {"mtc-team": team},
            "jobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": vertex_pools({
                "machineSpec": {"machineType": "a3-highgpu-8g",
                                "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
                "containerSpec": {"imageUri": "local", "command": [
                    sys.executable, str(ROOT / "examples" / "train.py")],
                    "args": ["--steps", "100000", "--checkpoint-every", "5",
                             "--step-time", "0.02"]}}, replicas)}}


@pytest.mark.parametrize(("queues", "field"), [
    ([{"team": "a", "partition": "nope", "nominalNodes": 1}], "mtcQueues[0].partition"),
    ([{"team": "a", "partition": "gpu", "nominalNodes": 2},
      {"team": "b", "partition": "gpu", "nominalNodes": 1}], "mtcQueues[1].nominalNodes"),
    ([{"team": "A!", "partition": "gpu", "nominalNodes": 1}], "mtcQueues[0].team"),
    ([{"team": "a", "partition": "gpu", "nominalNodes": 1},
      {"team": "a", "partition": "gpu", "nominalNodes": 1}], "mtcQueues[1].team"),
    ([{"team": "a", "partition": "gpu", "nominalNodes": -1}], "mtcQueues[0].nominalNodes"),
])
def test_bad_queues_are_refused_by_field(api: Api, queues: list[dict[str, Any]],
                                         field: str) -> None:
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=q1", queued_cluster(queues))
    assert resp.status_code == 400 and field in str(resp.json), resp.json
    with api.app.transaction() as uow:
        assert uow.clusters.get("q1") is None


@pytest.mark.slow
def test_a_borrows_and_gives_back_by_preemption_through_the_api(api: Api) -> None:
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c1", queued_cluster(QUEUES))
    assert resp.status_code == 200, resp.json
    api.done(resp.json)
    shown = api.call("GET", f"{CLUSTERS}/c1").json
    assert shown["mtcQueues"][1] == {"team": "b", "partition": "gpu", "nominalNodes": 1,
                                     "borrowingLimitNodes": 0}

    assert api.call("POST", f"{JOBS}?customJobId=ja", team_job("a", 2)).status_code == 200
    api.until(lambda: (j := api.call("GET", f"{JOBS}/ja").json)["state"]
          == "JOB_STATE_RUNNING" and j.get("mtcProgress", {}).get("latestCheckpoint"))
    assert api.call("POST", f"{JOBS}?customJobId=jb", team_job("b", 1)).status_code == 200
    waiting = api.until(lambda: (j := api.call("GET", f"{JOBS}/ja").json)
                    ["mtcProgress"].get("queue") and j)
    assert waiting["state"] == "JOB_STATE_PENDING" and waiting["mtcProgress"]["restartCount"] == 1
    assert waiting["mtcProgress"]["queue"]["team"] == "a"
    assert waiting["mtcProgress"]["queue"]["position"] == 1
    assert "borrow" in waiting["mtcProgress"]["queue"]["reason"]
    api.until(lambda: api.call("GET", f"{JOBS}/jb").json["state"] == "JOB_STATE_RUNNING")
    assert api.call("GET", f"{JOBS}/ja").json["state"] == "JOB_STATE_PENDING"
