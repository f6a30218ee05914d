"""`mtc job logs` on a real 2-rank job that restarts, against a running `mtc serve` (--api)
and on the same state directory in process (local mode): attempt 1's logs stay readable once
attempt 2 runs, --tail, and --follow (both modes at once) reading lines written after it
started, into the end of the job."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import ROOT, clean_env, cluster_body, job_body, mtc, mtc_json, write
from tests.serving import mtc_serve

TOKEN = "logs-admin"
# long enough (30 s at 0.05 s a step) that the resumed attempt is still training while a few
# CLI calls run, on a loaded machine too (300 steps finished first with the suite on two
# processes beside other work)
STEPS = 600
pytestmark = pytest.mark.slow


def wait(what: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("timed out")


def follower(state: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "services.cli.main", "--state-dir",
                             str(state), "job", "logs", "t1", "--follow"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_job_logs_local_and_remote_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        remote_env = clean_env(MTC_API=url, MTC_API_TOKEN=TOKEN)
        local_env = clean_env()

        def remote(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            return mtc(state, *args, env=remote_env, check=check)

        def local(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            return mtc(state, *args, env=local_env, check=check)

        spec = write(tmp_path / "cluster.json", cluster_body())
        mtc_json(state, "cluster", "create", "demo", "-f", str(spec), "--wait", "20",
                 env=remote_env)
        body = job_body(STEPS, step_time=0.05)
        mtc(state, "job", "submit", "-f", str(write(tmp_path / "job.json", body)),
            "--job-id", "t1", env=remote_env)
        job = wait(lambda: (j := mtc_json(state, "job", "get", "t1", env=remote_env))
                   ["mtcProgress"].get("latestCheckpoint") and j)
        victim = job["mtcProgress"]["nodes"][0]
        local("node", "fault", victim, "--xid", "79")  # the job checkpoints and moves
        wait(lambda: (j := mtc_json(state, "job", "get", "t1", env=remote_env))
             ["mtcProgress"]["attempt"] == 2 and j["state"] == "JOB_STATE_RUNNING")
        wait(lambda: "resumed from step" in remote("job", "logs", "t1").stdout)
        before = remote("job", "logs", "t1").stdout
        assert f"done at step {STEPS}" not in before  # attempt 2 is still training
        followers = [follower(state, remote_env), follower(state, local_env)]

        # attempt 1 is kept: both ranks, both modes, the same text
        for rank in ("0", "1"):
            first = remote("job", "logs", "t1", "--attempt", "1", "--rank", rank).stdout
            assert first == local("job", "logs", "t1", "--attempt", "1", "--rank", rank).stdout
            assert f"rank {rank}/2" in first and "SIGTERM received: preempted" in first
            assert "no checkpoint found: starting from step 0" in first
        last = remote("job", "logs", "t1", "--attempt", "1", "--tail", "2").stdout.splitlines()
        assert len(last) == 2 and "exiting 75" in last[-1]

        outs = []
        for proc in followers:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0, err
            outs.append(out)
        assert outs[0] == outs[1]
        assert outs[0].startswith(before)  # what was there, then what came after
        assert "resumed from step" in outs[0] and f"done at step {STEPS}" in outs[0]
        assert "model saved" in outs[0]  # rank 0: the chief's last lines
        assert mtc_json(state, "job", "get", "t1", env=remote_env)["state"] \
            == "JOB_STATE_SUCCEEDED"

        # the same for rank 1 and attempt 2, and the errors each mode gives
        assert "rank 1/2" in local("job", "logs", "t1", "--rank", "1").stdout
        for args, field in ((("--rank", "7"), "rank"), (("--attempt", "3"), "attempt")):
            for run in (remote, local):
                proc = run("job", "logs", "t1", *args, check=False)
                assert proc.returncode == 2 and "INVALID_ARGUMENT" in proc.stderr
                assert f"{field}:" in proc.stderr
        for run in (remote, local):
            proc = run("job", "logs", "nope", check=False)
            assert proc.returncode == 2 and "NOT_FOUND" in proc.stderr
