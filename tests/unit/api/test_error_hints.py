"""A 400 tells a user how to fix the request: an unknown field names the closest real one."""

from __future__ import annotations

from typing import Any

from tests.serving import PARENT
from tests.unit.api.conftest import Api

JOBS = f"/v1/{PARENT}/customJobs"


def _violations(resp: Any) -> dict[str, str]:
    assert resp.status_code == 400, resp.get_data(as_text=True)
    return {v["field"]: v["description"] for d in resp.json["error"].get("details", [])
            for v in d.get("fieldViolations", [])}


def test_an_unknown_field_suggests_the_closest_one(api: Api) -> None:
    body: dict[str, Any] = {"displayName": "j", "jobSpec": {
        "persistentResourceId": "c1", "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g"}, "replicaCount": "1",
            "containerSpec": {"imageUri": "local", "comand": ["true"]}}]}}
    found = _violations(api.call("POST", JOBS, body))
    where = "jobSpec.workerPoolSpecs[0].containerSpec.comand"
    assert "did you mean 'command'?" in found[where], found
    top = _violations(api.call("POST", JOBS, {"dispayName": "j", "jobSpec": {}}))
    assert "did you mean 'displayName'?" in top["dispayName"], top
    far = _violations(api.call("POST", JOBS, {"zzzz": 1, "jobSpec": {}}))
    assert "did you mean" not in far["zzzz"]


def test_a_machine_type_the_cluster_lacks_names_the_field_and_lists_the_offered_ones(
        api: Api) -> None:
    api.cluster("c1")
    spec = {"machineType": "a2-highgpu-1g", "acceleratorType": "NVIDIA_TESLA_A100",
            "acceleratorCount": 1}
    body = {"displayName": "j", "jobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": [{
        "machineSpec": spec, "replicaCount": "1",
        "containerSpec": {"imageUri": "local", "command": ["true"]}}]}}
    found = _violations(api.call("POST", JOBS, body))
    (field, text), = found.items()
    assert field == "jobSpec.workerPoolSpecs[0].machineSpec.machineType", found
    assert "offers no a2-highgpu-1g" in text and "it offers: " in text, text
    offered = text.split("it offers: ", 1)[1]
    assert "a3-highgpu-8g with 8 x NVIDIA_H100_80GB" in offered, text
