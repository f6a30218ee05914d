"""`mtc tensorboard JOB`: the real TensorBoard, on a free loopback port, over a real job's
event files (examples/train.py, one run per attempt), answering /data/runs and the scalars
plugin; --api is refused (the event files are read on this machine)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from services.api.names import Parent
from services.cli.client import LocalClient
from services.cli.commands_logs import tensorboard_command
from services.wiring.embedded import embedded
from tests.cli_support import ROOT, clean_env, cluster_body, job_body, mtc
from tests.serving import free_port

pytestmark = pytest.mark.integration  # real TensorBoard and worker processes

LOCAL = Parent("local", "local")


def finished_job(state: Path) -> None:
    app = embedded(state)
    try:
        client = LocalClient(app)
        op = client.create_cluster(LOCAL, "demo", cluster_body())
        assert client.wait_operation(op["name"], 20)["done"]
        body = job_body(30, step_time=0.0)
        client.create_job(LOCAL, body, "tb1")
        assert app.run(lambda: client.get_job(LOCAL, "tb1")["state"] == "JOB_STATE_SUCCEEDED",
                       timeout_s=40)
    finally:
        app.compute.kill_all()
        app.close()


def test_mtc_tensorboard_serves_the_jobs_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    finished_job(state)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "services.cli.main", "--state-dir",
                             str(state), "tensorboard", "tb1", "--port", str(port)], cwd=ROOT,
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert re.search(rf"http://127\.0\.0\.1:{port}/", first), first
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        runs: list[str] = []
        while "attempt-1" not in runs:
            assert proc.poll() is None and time.monotonic() < deadline, runs
            with contextlib.suppress(requests.RequestException):
                runs = requests.get(f"{url}/data/runs", timeout=2).json()
            time.sleep(0.3)
        tags = requests.get(f"{url}/data/plugin/scalars/tags", timeout=5).json()
        assert "loss" in tags["attempt-1"]
        points = requests.get(f"{url}/data/plugin/scalars/scalars",
                              params={"run": "attempt-1", "tag": "loss"}, timeout=5).json()
        assert [p[1] for p in points] == list(range(1, 31))  # [wall_time, step, value]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    deadline = time.monotonic() + 15  # SIGTERM to mtc stops TensorBoard too: no orphan left
    while True:
        try:
            requests.get(f"http://127.0.0.1:{port}/data/runs", timeout=1)
        except requests.ConnectionError:
            break
        except requests.Timeout:
            pass  # still there (only slow to answer): look again until the deadline
        assert time.monotonic() < deadline, "TensorBoard outlived mtc tensorboard"
        time.sleep(0.2)


def test_mtc_tensorboard_refuses_api_and_unknown_jobs(tmp_path: Path) -> None:
    proc = mtc(tmp_path / "state", "tensorboard", "x", check=False,
               env=clean_env(MTC_API="http://127.0.0.1:9"))
    assert proc.returncode == 2 and "local state directory only" in proc.stderr
    proc = mtc(tmp_path / "state", "tensorboard", "nope", check=False)
    assert proc.returncode == 2 and "NOT_FOUND" in proc.stderr


def test_runs_of_a_tuning_job_are_named_per_trial(tmp_path: Path) -> None:
    one = tensorboard_command({"": tmp_path / "a"}, 6123)
    assert one[1:3] == ["--logdir", str(tmp_path / "a")]
    assert one[3:5] == ["--host", "127.0.0.1"]
    many = tensorboard_command({"trial-1": tmp_path / "a", "trial-2": tmp_path / "b"}, 6123)
    assert many[1:3] == ["--logdir_spec", f"trial-1:{tmp_path / 'a'},trial-2:{tmp_path / 'b'}"]
