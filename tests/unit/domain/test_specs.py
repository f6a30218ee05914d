"""Spec parsing: every rejection names the field path and the reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shared.domain.errors import ValidationError
from shared.domain.specs import ClusterSpec, CustomJobSpec
from tests.harness import CLUSTER, job_body


def mutate(base: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


DELETE = object()
POOL = ["nodePools", 0]
WPS = ["jobSpec", "workerPoolSpecs", 0]


@pytest.mark.parametrize(("path", "value", "field", "words"), [
    (["clusterId"], DELETE, "clusterId", "is required"),
    (["clusterId"], "UPPER", "clusterId", "lowercase"),
    (["clusterId"], 7, "clusterId", "must be a string"),
    (["nodePools"], [], "nodePools", "must not be empty"),
    (["nodePools"], {}, "nodePools", "must be a list"),
    ([*POOL, "nodeCount"], -1, "nodePools[0].nodeCount", "at least 0"),
    ([*POOL, "nodeCount"], True, "nodePools[0].nodeCount", "boolean"),
    ([*POOL, "spareCount"], 9, "nodePools[0].spareCount", "must not exceed nodeCount"),
    ([*POOL, "machineSpec"], DELETE, "nodePools[0].machineSpec", "is required"),
    ([*POOL, "machineSpec", "acceleratorCount"], 17, "nodePools[0].machineSpec.acceleratorCount",
     "at most 16"),
    ([*POOL, "machineSpec", "acceleratorType"], DELETE,
     "nodePools[0].machineSpec.acceleratorType", "required when acceleratorCount"),
    (["partitions", 0, "nodePoolIds", 0], "nope", "partitions[0].nodePoolIds[0]",
     "unknown node pool"),
    (["partitions", 0, "name"], "", "partitions[0].name", "must not be empty"),
])
def test_cluster_spec_rejections(path: list[Any], value: Any, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        ClusterSpec.parse(mutate(CLUSTER, path, value))
    assert err.value.path == field
    assert words in err.value.reason


def test_duplicate_pools_and_double_membership_are_rejected() -> None:
    spec = copy.deepcopy(CLUSTER)
    spec["nodePools"].append(copy.deepcopy(spec["nodePools"][0]))
    with pytest.raises(ValidationError, match=r"nodePools\[1\].id: duplicate"):
        ClusterSpec.parse(spec)
    spec = copy.deepcopy(CLUSTER)
    spec["partitions"].append({"name": "other", "nodePoolIds": ["gpu"]})
    with pytest.raises(ValidationError, match="already in partition 'train'"):
        ClusterSpec.parse(spec)


def test_partitions_default_to_one_per_pool_and_round_trip() -> None:
    spec = ClusterSpec.parse(mutate(CLUSTER, ["partitions"], DELETE))
    assert [p.name for p in spec.partitions] == ["gpu"]
    full = ClusterSpec.parse(CLUSTER)
    assert ClusterSpec.parse(full.to_dict()) == full


@pytest.mark.parametrize(("path", "value", "field", "words"), [
    (["displayName"], DELETE, "displayName", "is required"),
    (["jobSpec"], DELETE, "jobSpec", "is required"),
    (["jobSpec", "workerPoolSpecs"], [], "jobSpec.workerPoolSpecs", "must not be empty"),
    ([*WPS, "replicaCount"], 0, "jobSpec.workerPoolSpecs[0].replicaCount", "at least 1"),
    ([*WPS, "containerSpec"], DELETE, "jobSpec.workerPoolSpecs[0]", "exactly one of"),
    ([*WPS, "containerSpec", "imageUri"], DELETE,
     "jobSpec.workerPoolSpecs[0].containerSpec.imageUri", "is required"),
    ([*WPS, "containerSpec", "command"], "python",
     "jobSpec.workerPoolSpecs[0].containerSpec.command", "must be a list"),
    ([*WPS, "containerSpec", "command"], ["python", 3],
     "jobSpec.workerPoolSpecs[0].containerSpec.command[1]", "must be a string"),
    ([*WPS, "containerSpec", "env"], [{"value": "x"}],
     "jobSpec.workerPoolSpecs[0].containerSpec.env[0].name", "is required"),
    ([*WPS, "machineSpec", "machineType"], DELETE,
     "jobSpec.workerPoolSpecs[0].machineSpec.machineType", "is required"),
    (["jobSpec", "scheduling"], {"timeout": "1h"}, "jobSpec.scheduling.timeout", "duration"),
    (["jobSpec", "scheduling"], {"restartJobOnWorkerRestart": "yes"},
     "jobSpec.scheduling.restartJobOnWorkerRestart", "must be a boolean"),
])
def test_custom_job_rejections(path: list[Any], value: Any, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        CustomJobSpec.parse(mutate(job_body(), path, value))
    assert err.value.path == field
    assert words in err.value.reason


def test_custom_job_accepts_python_package_and_round_trips() -> None:
    body = job_body(3)
    body["jobSpec"]["workerPoolSpecs"][0].pop("containerSpec")
    body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"] = {
        "executorImageUri": "img", "packageUris": ["gs://b/p.tar.gz"], "pythonModule": "trainer.task",
        "args": ["--epochs", "3"]}
    body["jobSpec"]["scheduling"] = {"timeout": "3600s", "restartJobOnWorkerRestart": True}
    body["jobSpec"]["baseOutputDirectory"] = {"outputUriPrefix": "gs://b/out"}
    spec = CustomJobSpec.parse(body)
    assert spec.replica_count == 3 and spec.scheduling.timeout_s == 3600.0
    assert CustomJobSpec.parse(spec.to_dict()) == spec
