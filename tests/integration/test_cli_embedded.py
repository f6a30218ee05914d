"""The CLI across real processes on the embedded default: state lives in sqlite, workers are
real subprocesses, and a killed command loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.cli.demo import CLUSTER_SPEC, job_spec

ROOT = Path(__file__).resolve().parents[2]


def mtc(state: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "services.cli.main", "--state-dir", str(state), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def mtc_json(state: Path, *args: str) -> Any:
    return json.loads(mtc(state, "--json", *args).stdout)


def wait_for(state: Path, predicate: Any, timeout: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mtc(state, "controller", "--for", "0.5")
        value = predicate()
        if value:
            return value
    raise AssertionError("timed out")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps(CLUSTER_SPEC))
    state = tmp_path / "state"
    out = mtc_json(state, "cluster", "create", "-f", str(spec), "--wait", "20")
    assert out["state"] == "READY"
    yield state
    from services.wiring.embedded import embedded

    app = embedded(state)
    app.compute.kill_all()
    app.close()


def test_state_is_shared_between_commands(cluster: Path) -> None:
    nodes = mtc_json(cluster, "node", "list")
    assert sorted(n["state"] for n in nodes) == ["idle"] * 5
    assert mtc_json(cluster, "cluster", "get", "demo")["state"] == "READY"
    table = mtc(cluster, "node", "list").stdout
    assert "PARTITION" in table and "demo-h100-003" in table


def test_bad_input_is_a_clear_error_and_changes_nothing(cluster: Path, tmp_path: Path) -> None:
    bad = tmp_path / "job.json"
    body = job_spec(10)
    body["jobSpec"]["workerPoolSpecs"][0]["replicaCount"] = 0
    bad.write_text(json.dumps(body))
    proc = mtc(cluster, "job", "submit", "--cluster", "demo", "-f", str(bad), check=False)
    assert proc.returncode == 2
    assert "jobSpec.workerPoolSpecs[0].replicaCount: must be at least 1" in proc.stderr
    assert mtc_json(cluster, "job", "list") == []
    proc = mtc(cluster, "node", "fault", "no-such-node", "--xid", "79", check=False)
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_fault_drains_requeues_and_repairs_across_processes(cluster: Path,
                                                            tmp_path: Path) -> None:
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job_spec(80)))
    mtc(cluster, "job", "submit", "--cluster", "demo", "-f", str(spec), "--job-id", "t1")
    job = wait_for(cluster, lambda: (j := mtc_json(cluster, "job", "get", "t1"))
                   ["latestCheckpoint"] and j)
    victim = job["nodes"][0]
    mtc(cluster, "node", "fault", victim, "--xid", "79")
    done = wait_for(cluster, lambda: (j := mtc_json(cluster, "job", "get", "t1"))["state"]
                    == "JOB_STATE_SUCCEEDED" and j, timeout=60)
    assert done["restartCount"] == 1 and victim not in done["nodes"]
    node = wait_for(cluster, lambda: next(n for n in mtc_json(cluster, "node", "list")
                                          if n["nodeId"] == victim)["state"] == "idle")
    assert node
    timeline = mtc(cluster, "events").stdout
    for words in ("XID 79", "diagnosed gpu_fell_off_bus", "SIGTERM", "requeued",
                  "resuming from checkpoint", "reboot done", "back in service",
                  "JOB_STATE_SUCCEEDED"):
        assert words in timeline, words


def test_a_killed_command_loses_nothing(cluster: Path, tmp_path: Path) -> None:
    """Kill `mtc` right after it committed the job: the next command delivers the rest."""
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job_spec(20)))
    cmd = [sys.executable, "-m", "services.cli.main", "--state-dir", str(cluster), "job",
           "submit", "--cluster", "demo", "-f", str(spec), "--job-id", "k1"]
    env = {**os.environ, "MTC_TEST_PAUSE_BEFORE_PUMP": "30"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    time.sleep(3.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    job = mtc_json(cluster, "job", "get", "k1")  # committed before the kill
    assert job["state"] in ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING")
    done = wait_for(cluster, lambda: mtc_json(cluster, "job", "get", "k1")["state"]
                    == "JOB_STATE_SUCCEEDED")
    assert done


def test_a_killed_worker_loses_no_job(cluster: Path, tmp_path: Path) -> None:
    """SIGKILL one rank's training process: the attempt ends, the job resumes and succeeds."""
    from services.wiring.embedded import embedded

    spec = tmp_path / "job.json"
    spec.write_text(json.dumps(job_spec(300)))
    mtc(cluster, "job", "submit", "--cluster", "demo", "-f", str(spec), "--job-id", "w1")
    wait_for(cluster, lambda: mtc_json(cluster, "job", "get", "w1")["latestCheckpoint"])
    app = embedded(cluster)
    try:
        launcher = next(w for w in app.compute.workers("w1") if w.rank == 1).pid
    finally:
        app.close()
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                and _parent(p) == launcher]
    assert children, "the launcher has no training process to kill"
    os.kill(children[0], signal.SIGKILL)
    done = wait_for(cluster, lambda: (j := mtc_json(cluster, "job", "get", "w1"))["state"]
                    == "JOB_STATE_SUCCEEDED" and j, timeout=60)
    assert done["restartCount"] == 1
    assert all(n["state"] == "idle" for n in mtc_json(cluster, "node", "list"))


def _parent(proc: Path) -> int:
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])
