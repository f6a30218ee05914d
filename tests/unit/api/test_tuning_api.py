"""HyperparameterTuningJobs over the Flask test client: bad bodies are 400s naming the field,
list pages, a small study runs to the end, cancel and delete."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest

from tests.serving import PARENT, ROOT
from tests.unit.api.conftest import Api

URL = f"/v1/{PARENT}/hyperparameterTuningJobs"
MACHINE = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
           "acceleratorCount": 8}


def body(command: list[str] | None = None, **kw: Any) -> dict[str, Any]:
    command = command or [sys.executable, str(ROOT / "examples" / "hp_trial.py"), "--steps=6",
                          "--report-every=2", "--checkpoint-every=2"]
    return {
        "displayName": "hp", "maxTrialCount": 3, "parallelTrialCount": 2,
        "studySpec": {"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
                      "parameters": [{"parameterId": "learning_rate",
                                      "discreteValueSpec": {"values": [0.01, 0.1, 0.2]}},
                                     {"parameterId": "momentum",
                                      "categoricalValueSpec": {"values": ["0.5"]}}],
                      "algorithm": "GRID_SEARCH"},
        "trialJobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": [
            {"machineSpec": MACHINE, "replicaCount": "1",
             "containerSpec": {"imageUri": "local", "command": command}}]},
        **kw}


def _with(path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body())
    node: Any = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    last = keys[-1]
    if value is KeyError:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return out


@pytest.mark.parametrize(("change", "field"), [
    (("studySpec.algorithm", "GRID"), "studySpec.algorithm"),
    (("studySpec.parameters.0.discreteValueSpec", KeyError), "studySpec.parameters[0]"),
    (("studySpec.parameters.0", {"parameterId": "x", "doubleValueSpec": {
        "minValue": 0, "maxValue": 1}}), "studySpec.parameters[0].doubleValueSpec"),
    (("studySpec.parameters.0.conditionalParameterSpecs", [{"parameterSpec": {}}]),
     "studySpec.parameters[0].conditionalParameterSpecs"),
    (("studySpec.metrics", []), "studySpec.metrics"),
    (("studySpec.convexAutomatedStoppingSpec", {"maxStepCount": 3}),
     "studySpec.convexAutomatedStoppingSpec"),
    (("maxTrialCount", 0), "maxTrialCount"),
    (("parallelTrialCount", 5), "parallelTrialCount"),
    (("trialJobSpec.persistentResourceId", "nope"), "trialJobSpec.persistentResourceId"),
    (("trialJobSpec.persistentResourceId", KeyError), "trialJobSpec.persistentResourceId"),
    (("trialJobSpec.workerPoolSpecs.0.containerSpec.command", []),
     "trialJobSpec.workerPoolSpecs[0].containerSpec.command"),
    (("trialJobSpec.baseOutputDirectory", {"outputUriPrefix": "/etc"}),
     "trialJobSpec.baseOutputDirectory.outputUriPrefix"),
    (("trials", [{"id": "1"}]), "trials"),
    (("bogus", 1), "bogus"),
    (("displayName", ""), "displayName"),
])
def test_bad_bodies_are_400s_naming_the_field(api: Api, change: tuple[str, Any], field: str
                                              ) -> None:
    api.cluster("c1")
    resp = api.call("POST", URL, _with(*change))
    assert resp.status_code == 400, resp.json
    fields = [v["field"] for d in resp.json["error"].get("details", [])
              for v in d.get("fieldViolations", [])]
    assert field in fields, resp.json
    resp = api.call("POST", f"{URL}?hyperparameterTuningJobId=Bad_Id", body())
    assert resp.status_code == 400


def test_a_small_grid_runs_to_the_end(api: Api) -> None:
    api.cluster("c1")
    resp = api.call("POST", f"{URL}?hyperparameterTuningJobId=grid1", body())
    assert resp.status_code == 200, resp.json
    job = resp.json
    assert job["name"] == f"{PARENT}/hyperparameterTuningJobs/grid1"
    assert [t["state"] for t in job["trials"]] == ["ACTIVE", "ACTIVE"]
    again = api.call("POST", f"{URL}?hyperparameterTuningJobId=grid1", body())
    assert again.status_code == 200 and len(again.json["trials"]) == 2  # a retry: same job
    other = api.call("POST", f"{URL}?hyperparameterTuningJobId=grid1", body(displayName="x"))
    assert other.status_code == 409

    def finished() -> bool:
        got = api.call("GET", f"/v1/{job['name']}").json
        return bool(got["state"] == "JOB_STATE_SUCCEEDED")

    assert api.app.run(finished, timeout_s=60, tick_s=1)
    got = api.call("GET", f"/v1/{job['name']}").json
    assert [t["id"] for t in got["trials"]] == ["1", "2", "3"]
    lrs = [t["parameters"][0]["value"] for t in got["trials"]]
    assert lrs == [0.01, 0.1, 0.2]  # the grid, in order
    for t in got["trials"]:
        assert t["state"] == "SUCCEEDED"
        assert t["finalMeasurement"]["stepCount"] == "6"
        assert [m["stepCount"] for m in t["measurements"]] == ["2", "4", "6"]
        cj = api.call("GET", f"/v1/{t['customJob']}").json
        assert cj["state"] == "JOB_STATE_SUCCEEDED"
        command = cj["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"]
        args = cj["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"]
        assert command[-1] == "--checkpoint-every=2" and args[-1] == "--momentum=0.5"
        env = {e["name"]: e["value"] for e in cj["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["env"]}
        assert env["CLOUD_ML_TRIAL_ID"] == t["id"]
        assert env["CLOUD_ML_HP_METRIC_FILE"].endswith("/hypertune/output.metrics")
    losses = {t["id"]: t["finalMeasurement"]["metrics"][0]["value"] for t in got["trials"]}
    assert losses["1"] > losses["2"]  # a rate of 0.01 barely moves in 6 steps

    deleted = api.call("DELETE", f"/v1/{job['name']}")
    assert deleted.status_code == 200 and deleted.json["done"] is True
    assert api.call("GET", f"/v1/{job['name']}").status_code == 404
    assert api.call("GET", f"/v1/{got['trials'][0]['customJob']}").status_code == 404


def test_cancel_stops_the_trials_and_list_pages(api: Api) -> None:
    api.cluster("c1")
    slow = [sys.executable, "-c", "import time; time.sleep(60)"]
    names = []
    for i in range(3):
        resp = api.call("POST", f"{URL}?hyperparameterTuningJobId=h{i}",
                        body(slow, displayName=f"hp{i}", parallelTrialCount=1,
                             labels={"n": str(i)}))
        assert resp.status_code == 200, resp.json
        names.append(resp.json["name"])
    assert api.call("DELETE", f"/v1/{names[0]}").status_code == 400  # still running
    page = api.call("GET", f"{URL}?pageSize=2").json
    assert [j["name"] for j in page["hyperparameterTuningJobs"]] == names[:2]
    rest = api.call("GET", f"{URL}?pageSize=2&pageToken={page['nextPageToken']}").json
    assert [j["name"] for j in rest["hyperparameterTuningJobs"]] == names[2:]
    assert not rest.get("nextPageToken")
    one = api.call("GET", URL, query_string={"filter": 'labels.n="1"'}).json
    assert [j["name"] for j in one["hyperparameterTuningJobs"]] == [names[1]]
    assert api.call("GET", URL, query_string={"filter": "nope=1"}).status_code == 400

    for name in names:
        assert api.call("POST", f"/v1/{name}:cancel").json == {}

    def cancelled() -> bool:
        return all(api.call("GET", f"/v1/{n}").json["state"] == "JOB_STATE_CANCELLED"
                   for n in names)

    assert api.app.run(cancelled, timeout_s=30, tick_s=1)
    got = api.call("GET", f"/v1/{names[0]}").json
    assert got["error"]["code"] == 1
    assert [t["state"] for t in got["trials"]] == ["INFEASIBLE"]
    assert api.call("GET", f"/v1/{got['trials'][0]['customJob']}").json["state"] == \
        "JOB_STATE_CANCELLED"
    assert api.call("GET", f"/v1/{PARENT}/hyperparameterTuningJobs/zzz").status_code == 404
