"""A HyperparameterTuningJob through the official Vertex AI SDK
(REST transport) against a live ``mtc serve``. Six trials of examples/hp_trial.py, two at a
time; one trial's node gets an XID 79 mid-run (``mtc node fault`` on the server's state
directory, beside the running server): the trial resumes from its checkpoint on another node,
is not a failed trial, and the tuning job ends SUCCEEDED with every trial done and the best
trial the one the reported metric says."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core.client_options import ClientOptions
from google.cloud import aiplatform_v1 as aip
from google.oauth2.credentials import Credentials

from tests.serving import PARENT, ROOT, create_cluster, mtc_serve

TOKEN = "tuning-sdk-admin-token"
pytestmark = [pytest.mark.integration, pytest.mark.slow]
H = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("tuning") / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        op = create_cluster(url, TOKEN, "c1", workers=4)
        assert "error" not in op, op
        yield url, state


# 6 s a trial: the fault (a CLI process started once trial 1 has a checkpoint) must land
# while it still trains, on a loaded machine too (3.6 s was not always enough)
STEPS = 60


def study() -> aip.HyperparameterTuningJob:
    P = aip.StudySpec.ParameterSpec
    machine = aip.MachineSpec(machine_type="a3-highgpu-8g",
                              accelerator_type=aip.AcceleratorType.NVIDIA_H100_80GB,
                              accelerator_count=8)
    program = [sys.executable, str(ROOT / "examples" / "hp_trial.py")]
    return aip.HyperparameterTuningJob(
        display_name="hp-sdk",
        labels={"team": "sdk"},
        max_trial_count=6,
        parallel_trial_count=2,
        max_failed_trial_count=1,
        study_spec=aip.StudySpec(
            metrics=[aip.StudySpec.MetricSpec(metric_id="loss",
                                              goal=aip.StudySpec.MetricSpec.GoalType.MINIMIZE)],
            parameters=[
                P(parameter_id="learning_rate", scale_type=P.ScaleType.UNIT_LOG_SCALE,
                  double_value_spec=P.DoubleValueSpec(min_value=0.01, max_value=0.3)),
                P(parameter_id="momentum",
                  discrete_value_spec=P.DiscreteValueSpec(values=[0.0, 0.5, 0.9])),
            ],
            algorithm=aip.StudySpec.Algorithm.RANDOM_SEARCH),
        trial_job_spec=aip.CustomJobSpec(
            persistent_resource_id="c1",
            worker_pool_specs=[aip.WorkerPoolSpec(
                machine_spec=machine, replica_count=1,
                container_spec=aip.ContainerSpec(
                    image_uri="local",
                    command=[*program, f"--steps={STEPS}", "--step-time=0.1",
                             "--checkpoint-every=3", "--report-every=3"]))]))


def rest_job(url: str, name: str) -> dict[str, Any]:
    resp = requests.get(f"{url}/v1/{name}", headers=H, timeout=30)
    resp.raise_for_status()
    return resp.json()  # type: ignore[no-any-return]


def test_tuning_job_survives_a_node_fault(server: tuple[str, Path]) -> None:
    url, state = server
    start = time.monotonic()
    creds: Any = Credentials(token=TOKEN)  # type: ignore[no-untyped-call]
    c = aip.JobServiceClient(transport="rest", credentials=creds,
                             client_options=ClientOptions(api_endpoint=url))
    job = c.create_hyperparameter_tuning_job(parent=PARENT, hyperparameter_tuning_job=study())
    assert job.state == aip.JobState.JOB_STATE_RUNNING
    assert len(job.trials) == 2  # parallelTrialCount at once

    # wait until trial 1's job runs and has checkpointed, then break its node
    victim: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while not victim:
        assert time.monotonic() < deadline, "trial 1 never checkpointed"
        got = c.get_hyperparameter_tuning_job(name=job.name)
        trial = next(t for t in got.trials if t.id == "1")
        cj = rest_job(url, trial.custom_job)
        progress = cj.get("mtcProgress", {})
        if cj["state"] == "JOB_STATE_RUNNING" and progress.get("nodes") \
                and int(progress.get("latestCheckpoint", {}).get("step", "0")) > 0:
            victim = cj
        time.sleep(0.2)
    node = victim["mtcProgress"]["nodes"][0]
    fault = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "--state-dir", str(state), "node", "fault",
         node, "--xid", "79"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert fault.returncode == 0, fault.stderr

    deadline = time.monotonic() + 90
    while True:
        got = c.get_hyperparameter_tuning_job(name=job.name)
        if got.state in (aip.JobState.JOB_STATE_SUCCEEDED, aip.JobState.JOB_STATE_FAILED):
            break
        assert time.monotonic() < deadline, f"tuning job stuck in {got.state.name}"
        time.sleep(0.5)
    assert got.state == aip.JobState.JOB_STATE_SUCCEEDED, got.error
    assert [t.id for t in got.trials] == ["1", "2", "3", "4", "5", "6"]
    assert all(t.state == aip.Trial.State.SUCCEEDED for t in got.trials), got.trials
    assert got.end_time and got.start_time

    # the victim trial moved, resumed from a checkpoint after step 0, and still succeeded
    healed = rest_job(url, victim["name"])
    assert healed["mtcProgress"]["restartCount"] >= 1
    result = json.loads((state / "jobs" / f"cj-{victim['name'].rsplit('/', 1)[1]}" / "model"
                         / "result.json").read_text())
    assert len(result["resumed_from"]) >= 2 and result["resumed_from"][-1] > 0, result

    # every trial got its own parameters and reported its metric; the best is the best
    reported = {}
    for t in got.trials:
        params = {p.parameter_id: p.value for p in t.parameters}
        cj_id = t.custom_job.rsplit("/", 1)[1]
        out = json.loads((state / "jobs" / f"cj-{cj_id}" / "model" / "result.json").read_text())
        assert out["learning_rate"] == pytest.approx(params["learning_rate"])
        assert out["momentum"] == pytest.approx(params["momentum"])
        assert t.final_measurement.step_count == STEPS
        assert t.final_measurement.metrics[0].metric_id == "loss"
        assert t.final_measurement.metrics[0].value == pytest.approx(out["loss"])
        assert len(t.measurements) == STEPS // 3  # every third step, across the resume too
        reported[t.id] = out["loss"]
    best = min(reported, key=lambda k: reported[k])
    best_trial = min(got.trials, key=lambda t: t.final_measurement.metrics[0].value)
    assert best_trial.id == best
    assert len({tuple(p.value for p in t.parameters) for t in got.trials}) == 6

    listed = c.list_hyperparameter_tuning_jobs(parent=PARENT)
    assert [j.name for j in listed] == [job.name]
    print(f"tuning job done in {time.monotonic() - start:.1f} s")
