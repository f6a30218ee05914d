"""What `mtc tensorboard` shows: a CustomJob's event directory (its attempts are the runs),
or a HyperparameterTuningJob's, one per trial (each trial is a CustomJob)."""

from __future__ import annotations

import sys
import time

import pytest

from services.api.names import Parent
from services.cli.commands_logs import tensorboard_runs
from tests.serving import PARENT, ROOT
from tests.unit.api.conftest import Api

pytestmark = pytest.mark.slow  # real training workers write the event files

TRAIN = [sys.executable, str(ROOT / "examples" / "train.py"), "--steps", "5"]
MACHINE = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
           "acceleratorCount": 8}
WHERE = Parent(*PARENT.split("/")[1::2])


def test_a_tuning_jobs_runs_are_its_trials_event_dirs(api: Api) -> None:
    api.cluster(workers=2)
    study = {
        "displayName": "hp", "maxTrialCount": 2, "parallelTrialCount": 2,
        "studySpec": {"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
                      "parameters": [{"parameterId": "lr",
                                      "discreteValueSpec": {"values": [0.01, 0.1]}}],
                      "algorithm": "GRID_SEARCH"},
        "trialJobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": [
            {"machineSpec": MACHINE, "replicaCount": "1",
             "containerSpec": {"imageUri": "local", "command": TRAIN}}]}}
    url = f"/v1/{PARENT}/hyperparameterTuningJobs"
    resp = api.call("POST", f"{url}?hyperparameterTuningJobId=s1", study)
    assert resp.status_code == 200, resp.json
    deadline = time.monotonic() + 30
    while len(api.call("GET", f"{url}/s1").json.get("trials", [])) < 2:
        assert time.monotonic() < deadline
        api.app.pump(budget_s=0.3)
        time.sleep(0.05)
    runs = tensorboard_runs(api.app, WHERE, "s1")
    assert sorted(runs) == ["trial-1", "trial-2"]
    assert len(set(runs.values())) == 2 and all(p.name == "logs" for p in runs.values())
    while not all(list(p.glob("attempt-1/events.*")) for p in runs.values()):
        assert time.monotonic() < deadline
        api.app.pump(budget_s=0.3)
        time.sleep(0.05)
    trial_job = api.call("GET", f"{url}/s1").json["trials"][0]["customJob"].rsplit("/", 1)[1]
    assert tensorboard_runs(api.app, WHERE, trial_job) == {"": runs["trial-1"]}
