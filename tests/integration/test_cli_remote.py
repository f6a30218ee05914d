"""The CLI against a real `mtc serve` on a free port (remote mode): the token comes from the
file the server writes, roles are enforced, and the answers are the local mode's JSON."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli_support import ROOT, clean_env, cluster_body, job_body, mtc, mtc_json, write

pytestmark = pytest.mark.integration  # `mtc serve` and the CLI as subprocesses


@dataclass
class Server:
    state: Path
    url: str

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(MTC_API=self.url, **extra)

    def run(self, *args: str, check: bool = True, **extra: str
            ) -> subprocess.CompletedProcess[str]:
        return mtc(self.state, *args, check=check, env=self.env(**extra))

    def json(self, *args: str, **extra: str) -> Any:
        return mtc_json(self.state, *args, env=self.env(**extra))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "--state-dir", str(state), "serve",
         "--port", "0", "--for", "120"], cwd=ROOT, env=clean_env(PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"mtc API on (http://\S+)", first)
        assert match, first
        assert (state / "api-token").exists()
        yield Server(state, match.group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        from services.wiring.embedded import embedded

        app = embedded(state)
        app.compute.kill_all()
        app.close()


def test_cluster_job_and_roles_over_http(server: Server, tmp_path: Path) -> None:
    spec = write(tmp_path / "cluster.json", cluster_body())
    cluster = server.json("cluster", "create", "demo", "-f", str(spec), "--wait", "20")
    assert cluster["state"] == "READY"
    assert cluster["name"] == "projects/local/locations/local/modelDevelopmentClusters/demo"
    assert "h100:4(+1)" in server.run("cluster", "list").stdout

    job_file = write(tmp_path / "job.json", job_body(20, cluster=None))
    job = server.json("job", "submit", "-f", str(job_file), "--cluster", "demo",
                      "--job-id", "r1")
    assert job["name"].endswith("/customJobs/r1")
    deadline = time.monotonic() + 20
    while job["state"] != "JOB_STATE_SUCCEEDED":  # the server drives it; we only read
        assert time.monotonic() < deadline, job
        time.sleep(0.3)
        job = server.json("job", "get", "r1")
    assert job["mtcProgress"]["latestCheckpoint"]["step"] == "20"
    table = server.run("job", "list").stdout
    assert "r1" in table and "SUCCEEDED" in table
    assert [j["name"] for j in server.json("job", "list")] == [job["name"]]
    nodes = server.json("cluster", "nodes", "demo")
    assert len(nodes) == 5 and all(n["state"] == "idle" for n in nodes)

    # the same state read in process (local mode) is the same wire JSON
    assert mtc_json(server.state, "job", "get", "r1") == job

    # a viewer reads, and is refused a submit
    viewer = mtc(server.state, "token", "create", "--role", "viewer", "--name", "ro").stdout
    viewer = viewer.strip()
    assert viewer.startswith("mtc_")
    assert server.json("job", "get", "r1", "--token", viewer)["state"] == "JOB_STATE_SUCCEEDED"
    proc = server.run("job", "submit", "-f", str(job_file), "--cluster", "demo",
                      "--token", viewer, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: PERMISSION_DENIED: ")
    assert "aiplatform.customJobs.create" in proc.stderr
    assert len(server.json("job", "list")) == 1

    # a revoked token, a wrong one
    ro = next(t for t in mtc_json(server.state, "token", "list") if t["principal"] == "token:ro")
    mtc(server.state, "token", "revoke", ro["id"])
    for token in (viewer, "mtc_nope"):
        proc = server.run("job", "list", "--token", token, check=False)
        assert proc.returncode == 2 and "error: UNAUTHENTICATED:" in proc.stderr

    # local-state commands refuse rather than act on this machine's directory
    for args in (("node", "fault", "demo-h100-000", "--xid", "79"), ("events",),
                 ("token", "list")):
        proc = server.run(*args, check=False)
        assert proc.returncode == 2 and "local state directory only" in proc.stderr, args


def test_errors_over_http_read_like_local_ones(server: Server, tmp_path: Path) -> None:
    body = cluster_body()
    body["nodePools"][0]["scalingSpec"] = {"minNodeCount": 2, "maxNodeCount": 3}
    body["nodePools"][1]["bogus"] = True
    bad = write(tmp_path / "bad.json", body)
    remote = server.run("cluster", "create", "demo", "-f", str(bad), check=False)
    local = mtc(server.state, "cluster", "create", "demo", "-f", str(bad), check=False)
    assert remote.returncode == local.returncode == 2
    assert remote.stderr == local.stderr
    assert remote.stderr.startswith("error: INVALID_ARGUMENT: ")
    assert "nodePools[1].bogus: unknown field" in remote.stderr
    body["nodePools"][1].pop("bogus")
    proc = server.run("cluster", "create", "demo", "-f", str(write(bad, body)), check=False)
    assert proc.stderr.startswith("error: INVALID_ARGUMENT: nodePools[0].scalingSpec."
                                  "maxNodeCount: must equal minNodeCount")
    proc = server.run("job", "get", "nope", check=False)
    assert proc.returncode == 2 and "error: NOT_FOUND:" in proc.stderr
    dead = mtc(server.state, "job", "list", check=False,
               env=clean_env(MTC_API="http://127.0.0.1:9", MTC_API_TOKEN="x"))
    assert dead.returncode == 2 and "error: UNAVAILABLE:" in dead.stderr


def test_operator_drain_and_resume_over_http(server: Server, tmp_path: Path) -> None:
    spec = write(tmp_path / "cluster.json", cluster_body())
    server.json("cluster", "create", "demo", "-f", str(spec), "--wait", "20")
    op = ("--cluster", "demo", "--reason")
    node = server.json("node", "drain", "demo-h100-000", *op, "bad fan")
    assert node["operatorDrained"] is True and node["state"] == "drained"
    assert server.json("node", "resume", "demo-h100-000", *op, "fixed")["state"] == "idle"
    proc = server.run("node", "return", "demo-h100-000", *op, "x", check=False)
    assert proc.returncode == 2 and "FAILED_PRECONDITION" in proc.stderr
    assert "not FAILED" in proc.stderr
