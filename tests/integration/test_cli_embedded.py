"""The CLI across real processes on the embedded default (local mode: no server, no token):
state lives in sqlite, workers are real subprocesses, and a killed command loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import ROOT, clean_env, cluster_body, job_body, mtc, mtc_json, write

pytestmark = pytest.mark.integration  # the CLI as subprocesses, real workers


def wait_for(state: Path, predicate: Any, timeout: float = 40.0, *,
             pump: bool = False) -> Any:
    """Poll with `mtc` commands while the fixture's controller process moves the state
    (``pump``: no controller runs, each poll runs `mtc controller` for half a second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pump:
            mtc(state, "controller", "--for", "0.5")
        value = predicate()
        if value:
            return value
        time.sleep(0 if pump else 0.2)
    raise AssertionError("timed out")


@pytest.fixture
def quiet_cluster(tmp_path: Path) -> Iterator[Path]:
    """A cluster made by one command; nothing else runs on its state between commands."""
    spec = write(tmp_path / "cluster.json", cluster_body())
    state = tmp_path / "state"
    out = mtc_json(state, "cluster", "create", "demo", "-f", str(spec), "--wait", "20")
    assert out["state"] == "READY"
    assert out["name"] == "projects/local/locations/local/modelDevelopmentClusters/demo"
    try:
        yield state
    finally:
        from services.wiring.embedded import embedded

        app = embedded(state)
        app.compute.kill_all()
        app.close()


@pytest.fixture
def cluster(quiet_cluster: Path) -> Iterator[Path]:
    """The cluster with `mtc controller` running beside the test's commands (as an operator
    leaves it running): every command is still its own process on the same state."""
    state = quiet_cluster
    controller = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "--state-dir", str(state), "controller",
         "--for", "600"], cwd=ROOT, env=clean_env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        yield state
    finally:
        controller.send_signal(signal.SIGINT)  # its Ctrl-C: the loop ends between passes
        try:
            controller.wait(timeout=20)
        except subprocess.TimeoutExpired:
            controller.kill()
            controller.wait()


def progress(job: dict[str, Any]) -> dict[str, Any]:
    return job["mtcProgress"]  # type: ignore[no-any-return]


def test_state_is_shared_between_commands(cluster: Path) -> None:
    nodes = mtc_json(cluster, "node", "list")
    assert sorted(n["state"] for n in nodes) == ["idle"] * 5  # 4 workers (1 a spare), login
    assert mtc_json(cluster, "cluster", "nodes", "demo") == nodes
    assert mtc_json(cluster, "cluster", "get", "demo")["state"] == "READY"
    assert [c["name"] for c in mtc_json(cluster, "cluster", "list")] == [
        "projects/local/locations/local/modelDevelopmentClusters/demo"]
    table = mtc(cluster, "node", "list").stdout
    assert "PARTITION" in table and "demo-h100-003" in table
    table = mtc(cluster, "cluster", "list").stdout
    assert "h100:4(+1)" in table and "train" in table and "READY" in table
    # another project sees none of it
    assert mtc_json(cluster, "cluster", "list", "--project", "other") == []
    proc = mtc(cluster, "--project", "other", "cluster", "get", "demo", check=False)
    assert proc.returncode == 2 and "error: NOT_FOUND:" in proc.stderr


def test_submit_get_list_cancel_delete_locally(cluster: Path, tmp_path: Path) -> None:
    """The same commands as against a server (test_cli_remote), in process: no token."""
    spec = write(tmp_path / "job.json", job_body(20, cluster=None))
    job = mtc_json(cluster, "job", "submit", "-f", str(spec), "--cluster", "demo",
                   "--job-id", "l1")
    assert job["name"] == "projects/local/locations/local/customJobs/l1"
    assert job["jobSpec"]["persistentResourceId"] == "demo"
    done = wait_for(cluster, lambda: (j := mtc_json(cluster, "job", "get", "l1"))["state"]
                    == "JOB_STATE_SUCCEEDED" and j)
    assert progress(done)["latestCheckpoint"]["step"] == "20"
    table = mtc(cluster, "job", "list").stdout
    assert "l1" in table and "SUCCEEDED" in table and "demo" in table
    assert [j["name"] for j in mtc_json(cluster, "job", "list", "--filter",
                                        'state="JOB_STATE_SUCCEEDED"')] == [job["name"]]
    assert mtc_json(cluster, "job", "list", "--filter", 'state="JOB_STATE_RUNNING"') == []
    long = write(tmp_path / "long.json", job_body(10_000))
    mtc(cluster, "job", "submit", "-f", str(long), "--job-id", "l2")
    proc = mtc(cluster, "job", "delete", "l2", check=False)
    assert proc.returncode == 2 and "error: FAILED_PRECONDITION:" in proc.stderr
    assert mtc_json(cluster, "job", "cancel", "l2")["state"] in (
        "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED")
    wait_for(cluster, lambda: mtc_json(cluster, "job", "get", "l2")["state"]
             == "JOB_STATE_CANCELLED")
    assert mtc_json(cluster, "job", "delete", "l2")["done"] is True
    assert mtc(cluster, "job", "get", "l2", check=False).returncode == 2
    proc = mtc(cluster, "cluster", "delete", "demo", "--wait", "20")
    assert "deleted" in proc.stdout
    assert mtc_json(cluster, "cluster", "list") == []


def test_bad_input_is_a_clear_error_and_changes_nothing(cluster: Path, tmp_path: Path) -> None:
    bad = tmp_path / "job.json"
    body = job_body(10)
    body["jobSpec"]["workerPoolSpecs"][0]["replicaCount"] = 0
    write(bad, body)
    proc = mtc(cluster, "job", "submit", "-f", str(bad), check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: INVALID_ARGUMENT: ")
    assert "jobSpec.workerPoolSpecs[0].replicaCount" in proc.stderr
    body = job_body(10)
    body["jobSpec"]["bogus"] = 1
    proc = mtc(cluster, "job", "submit", "-f", str(write(bad, body)), check=False)
    assert proc.returncode == 2 and "jobSpec.bogus: unknown field" in proc.stderr
    proc = mtc(cluster, "job", "submit", "-f", str(write(bad, job_body(10))), "--cluster",
               "other", check=False)
    assert proc.returncode == 2 and "disagrees" in proc.stderr
    proc = mtc(cluster, "cluster", "create", "demo2", "-f", str(bad), check=False)
    assert proc.returncode == 2 and "error: INVALID_ARGUMENT:" in proc.stderr
    assert mtc_json(cluster, "job", "list") == []
    proc = mtc(cluster, "node", "fault", "no-such-node", "--xid", "79", check=False)
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_a_killed_command_loses_nothing(quiet_cluster: Path, tmp_path: Path) -> None:
    """Kill `mtc` right after it committed the job: the next command delivers the rest."""
    cluster = quiet_cluster
    spec = tmp_path / "job.json"
    write(spec, job_body(20))
    cmd = [sys.executable, "-m", "services.cli.main", "--state-dir", str(cluster), "job",
           "submit", "-f", str(spec), "--job-id", "k1"]
    env = clean_env(MTC_TEST_PAUSE_BEFORE_PUMP="30")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    said: list[str] = []  # until it says it committed (however long its start takes on a busy machine)
    while not said or "committed" not in said[-1]:
        said.append(proc.stderr.readline() if proc.stderr else "")
        assert said[-1], f"the command ended before its commit: {''.join(said)}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    job = mtc_json(cluster, "job", "get", "k1")  # committed before the kill
    assert job["state"] in ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING")
    done = wait_for(cluster, lambda: mtc_json(cluster, "job", "get", "k1")["state"]
                    == "JOB_STATE_SUCCEEDED", pump=True)
    assert done


def test_a_killed_worker_loses_no_job(cluster: Path, tmp_path: Path) -> None:
    """SIGKILL one rank's training process: the attempt ends, the job resumes and succeeds
    (restartJobOnWorkerRestart: a kill nobody explains counts as the program's failure)."""
    from services.wiring.embedded import embedded

    spec = tmp_path / "job.json"
    body = job_body(300)
    body["jobSpec"]["scheduling"]["restartJobOnWorkerRestart"] = True
    write(spec, body)
    mtc(cluster, "job", "submit", "--cluster", "demo", "-f", str(spec), "--job-id", "w1")
    wait_for(cluster, lambda: mtc_json(cluster, "job", "get", "w1")["mtcProgress"]
             .get("latestCheckpoint"))
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
    assert progress(done)["restartCount"] == 1
    assert all(n["state"] == "idle" for n in mtc_json(cluster, "node", "list"))


def _parent(proc: Path) -> int:
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def _node(state: Path, node_id: str) -> dict[str, Any]:
    return next(n for n in mtc_json(state, "node", "list") if n["nodeId"] == node_id)


def test_operator_node_commands_locally(cluster: Path) -> None:
    """`mtc node return | release-hold | drain | resume`: audited, and done as they say."""
    a, b, d = "demo-h100-000", "demo-h100-001", "demo-h100-003"
    op = ("--cluster", "demo", "--reason")
    mtc(cluster, "node", "fault", d, "--xid", "54")  # needs a person: FAILED
    wait_for(cluster, lambda: _node(cluster, d)["state"] == "failed")
    assert mtc_json(cluster, "node", "return", d, *op, "cable reseated")["state"] == "verifying"
    # LocalCompute keeps a fault no repair clears: its checks fail, and it is FAILED again
    # (the passing path: tests/unit/handlers/test_operator_commands.py)
    wait_for(cluster, lambda: "after an operator returned it" in _node(cluster, d)["reason"])
    assert _node(cluster, d)["state"] == "failed"

    mtc(cluster, "node", "fault", b, "--xid", "79")  # d is out (FAILED), 1 of 4: held
    wait_for(cluster, lambda: _node(cluster, b)["state"] == "suspect")
    held = _node(cluster, b)
    out = mtc(cluster, "node", "release-hold", b, *op, "one node only").stdout
    assert "releaseHold done" in out
    # on its way through the repair, or (a slow CLI, a fast reimage) already back from it
    after = _node(cluster, b)
    assert after["state"] in ("draining", "drained", "repairing", "verifying") or (
        after["state"] == "idle" and after["failures"] > held["failures"]), after

    drained = mtc_json(cluster, "node", "drain", a, *op, "bad fan")
    assert drained["operatorDrained"] is True and drained["state"] == "drained"
    mtc(cluster, "controller", "--for", "1")
    assert _node(cluster, a)["state"] == "drained"  # agents' healthy reports do not undo it
    assert mtc_json(cluster, "node", "resume", a, *op, "fan replaced")["state"] == "idle"
    proc = mtc(cluster, "node", "resume", a, *op, "again", check=False)
    assert proc.returncode == 2 and "not drained by an operator" in proc.stderr
    proc = mtc(cluster, "node", "drain", a, "--cluster", "demo", check=False)
    assert proc.returncode == 2 and "--reason" in proc.stderr
    timeline = mtc(cluster, "events").stdout
    for words in ("drain: bad fan", "resume: fan replaced", "returnToService: cable reseated",
                  "releaseHold: one node only"):
        assert words in timeline, words
