"""What the API refuses of a PyTorch job's spec, naming the field: a pool 0 of more than one
replica (Vertex's layout) and a prebuilt training image mtc does not map to a runtime."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.serving import PARENT
from tests.unit.api.conftest import Api

JOBS = f"/v1/{PARENT}/customJobs"
MACHINE = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
           "acceleratorCount": 8}


def body(*pools: dict[str, Any]) -> dict[str, Any]:
    return {"displayName": "t", "jobSpec": {"persistentResourceId": "c1",
                                            "workerPoolSpecs": list(pools)}}


def container(image: str = "local", replicas: int = 1) -> dict[str, Any]:
    return {"machineSpec": MACHINE, "replicaCount": replicas,
            "containerSpec": {"imageUri": image, "command": [sys.executable, "-c", "pass"]}}


def package(image: str) -> dict[str, Any]:
    return {"machineSpec": MACHINE, "replicaCount": 1,
            "pythonPackageSpec": {"executorImageUri": image, "pythonModule": "trainer.task",
                                  "packageUris": ["gs://b/trainer-0.1.tar.gz"]}}


def violation(api: Api, job: dict[str, Any]) -> str:
    resp = api.call("POST", f"{JOBS}?customJobId=bad", job)
    assert resp.status_code == 400, resp.json
    field: str = resp.json["error"]["details"][0]["fieldViolations"][0]["field"]
    assert api.call("GET", f"{JOBS}/bad").status_code == 404  # nothing was made
    return field


@pytest.mark.parametrize("replicas", [2, 3])
def test_pool_0_has_exactly_one_replica(api: Api, replicas: int) -> None:
    api.cluster(workers=4)
    assert violation(api, body(container(replicas=replicas))) == \
        "jobSpec.workerPoolSpecs[0].replicaCount"
    ok = api.call("POST", f"{JOBS}?customJobId=good",
                  body(container(), container(replicas=replicas - 1)))
    assert ok.status_code == 200, ok.json  # pool 0 the primary, pool 1 the others


@pytest.mark.parametrize(("pool", "field"), [
    (container("us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.9-9.py399:latest"), None),
    (container("us-docker.pkg.dev/vertex-ai/training/jax-cpu.0-4.py310:latest"),
     "jobSpec.workerPoolSpecs[0].containerSpec.imageUri"),
    (package("europe-docker.pkg.dev/vertex-ai/training/tf-cpu.2-15.py310:latest"),
     "jobSpec.workerPoolSpecs[0].pythonPackageSpec.executorImageUri"),
])
def test_unknown_prebuilt_images_are_refused(api: Api, pool: dict[str, Any],
                                             field: str | None) -> None:
    api.cluster(workers=2)
    if field is None:  # any PyTorch version maps to the runtime there is
        resp = api.call("POST", f"{JOBS}?customJobId=ok", body(pool))
        assert resp.status_code == 200, resp.json
        api.call("POST", f"{JOBS}/ok:cancel")
        return
    assert violation(api, body(pool)) == field


def test_pools_of_one_machine_type_share_its_nodes(api: Api) -> None:
    api.cluster(workers=1)
    assert violation(api, body(container(), container())) == \
        "jobSpec.workerPoolSpecs[1].replicaCount"  # 2 replicas, 1 node: never placeable
