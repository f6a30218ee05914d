"""A tenant's job never reaches the host or the server's secrets: probed as an attacker would,
through the API of a real ``mtc serve`` (as root where the machine allows: the case the
launcher's isolation is about).

* Defect 1: a job's ``env`` reached the root launcher (``PYTHONPATH``, ``PYTHONHOME``), and
  jobs shared ``/tmp``, so one job planted ``sitecustomize.py`` that the next job's
  ``PYTHONPATH`` made a root interpreter run.
* Defect 2: the server's admin token (``MTC_API_TOKEN``) was in every job's environment and
  in the standbys table, in plaintext.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.serving import PARENT, cluster_body, create_cluster, mtc_serve, wait_until

pytestmark = pytest.mark.integration

ROOT_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                               reason="the launcher runs as root only under a root server")
TOKEN = "admin-" + secrets.token_hex(16)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}

# job 1 of the repro: leaves a sitecustomize.py that reports a root interpreter
PLANT = """
import os, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
os.chmod(d, 0o777)
with open(os.path.join(d, "sitecustomize.py"), "w") as f:
    f.write("import os\\nif os.getuid() == 0:\\n"
            "    open(os.path.join(%r, 'PWNED'), 'w').write(str(os.getuid()))\\n" % d)
"""
# what a job sees of the server's secrets
PRY = """
import json, os, sys
out = {"env": dict(os.environ)}
try:
    out["server_environ"] = open("/proc/%s/environ" % sys.argv[1], "rb").read().decode("latin-1")
except OSError as exc:
    out["server_environ"] = type(exc).__name__
with open(os.path.join(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/", 1), "pry.json"), "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    state = tmp_path_factory.mktemp("tenant") / "state"
    with mtc_serve(state, TOKEN) as url:
        create_cluster(url, TOKEN, workers=2)
        yield url, state


def _submit(url: str, command: list[str], bucket_path: str,
            env: dict[str, str] | None = None) -> str:
    """Submit a one-replica job; its name."""
    pool: dict[str, Any] = {
        "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                        "acceleratorCount": 8},
        "replicaCount": "1",
        "containerSpec": {"imageUri": "local", "command": command,
                          "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}}
    body = {"displayName": "probe", "jobSpec": {
        "persistentResourceId": "c1", "workerPoolSpecs": [pool],
        "baseOutputDirectory": {"outputUriPrefix": f"gs://tenant-bkt/{bucket_path}"}}}
    made = requests.post(f"{url}/v1/{PARENT}/customJobs", json=body, headers=HEADERS, timeout=30)
    assert made.status_code == 200, made.text
    return str(made.json()["name"])


def _run_job(url: str, command: list[str], env: dict[str, str] | None = None,
             bucket_path: str = "run") -> dict[str, Any]:
    """Submit a one-replica job, wait until it ends; its final view."""
    return _ended(url, _submit(url, command, bucket_path, env))


def _ended(url: str, name: str, timeout_s: float = 90) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        job = requests.get(f"{url}/v1/{name}", headers=HEADERS, timeout=30).json()
        return job if job.get("state") in TERMINAL else None

    return wait_until(f"{name} to end", ended, timeout_s=timeout_s, interval_s=0.3)  # type: ignore[no-any-return]


@ROOT_ONLY
def test_defect_1_a_planted_sitecustomize_never_runs_as_root(served: tuple[str, Path],
                                                            tmp_path: Path) -> None:
    """The repro as reported: job 1 plants ``/tmp/x/sitecustomize.py`` (a 0777 directory)
    that writes ``/tmp/x/PWNED`` when its uid is 0; job 2 runs ``true`` with
    ``PYTHONPATH=/tmp/x``. No ``PWNED`` appears, and job 2 succeeds. The host's ``/tmp/x``
    is planted by the test too, so the launcher's isolation is shown apart from the
    private ``/tmp`` each job has."""
    url, _ = served
    x = Path("/tmp") / f"mtc-x-{secrets.token_hex(4)}"
    try:
        first = _run_job(url, ["python3", "-c", PLANT, str(x)])
        assert first["state"] == "JOB_STATE_SUCCEEDED", first
        assert not x.exists(), "job 1 wrote the host's /tmp: jobs must have their own"
        subprocess.run([sys.executable, "-c", PLANT, str(x)], check=True, timeout=30)
        assert (x / "sitecustomize.py").exists()
        second = _run_job(url, ["true"], env={"PYTHONPATH": str(x)})
        assert second["state"] == "JOB_STATE_SUCCEEDED", second
        assert not (x / "PWNED").exists(), "a root interpreter ran the job's PYTHONPATH"
        # the job's own interpreter does see its PYTHONPATH (it is the job's), as itself
        third = _run_job(url, ["python3", "-c", "pass"], env={"PYTHONPATH": str(x)})
        assert third["state"] == "JOB_STATE_SUCCEEDED", third
        assert not (x / "PWNED").exists()
    finally:
        shutil.rmtree(x, ignore_errors=True)


@ROOT_ONLY
def test_defect_1_pythonhome_in_a_job_does_not_kill_its_launcher(served: tuple[str, Path]
                                                                ) -> None:
    """``PYTHONHOME=/nonexistent`` killed the root launcher, and the job ended FAILED as the
    program's own failure; it is the job's variable only, and ``true`` ignores it."""
    url, _ = served
    job = _run_job(url, ["true"], env={"PYTHONHOME": "/nonexistent", "LD_PRELOAD": "",
                                       "PYTHONSTARTUP": "/nonexistent"})
    assert job["state"] == "JOB_STATE_SUCCEEDED", job


def test_defect_2_the_admin_token_is_in_no_job_and_nowhere_in_plaintext(
        served: tuple[str, Path]) -> None:
    """A job reads its whole environment and tries the server's ``/proc/<pid>/environ``:
    the admin token is in neither (the server took it out of its own environment at
    start, and a job's environment is an allow-list plus its own); it is stored nowhere
    in the state directory in plaintext either (the standbys table held it)."""
    url, state = served
    server_pid = _server_pid(state)
    job = _run_job(url, [sys.executable, "-c", PRY, str(server_pid)], bucket_path="pry")
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    seen = json.loads((state / "jobs" / "gcs" / "tenant-bkt" / "pry" / "model" / "pry.json")
                      .read_text())
    assert TOKEN not in json.dumps(seen["env"]), "the admin token is in the job's environment"
    assert "MTC_API_TOKEN" not in seen["env"]
    assert TOKEN not in seen["server_environ"]
    assert requests.get(f"{url}/v1/{PARENT}/customJobs", headers=HEADERS,
                        timeout=30).status_code == 200  # the token still works, from memory
    time.sleep(0.5)  # a standby row written after the job's end is written by now
    for path in state.rglob("*"):
        if path.is_file() and path.stat().st_size < 64 * 1024 * 1024:
            assert TOKEN.encode() not in path.read_bytes(), f"the admin token is in {path}"


CALL = """
import json, os, sys, urllib.error, urllib.request
parent, other = sys.argv[1], sys.argv[2]
token = open(os.environ["MTC_JOB_TOKEN_FILE"]).read().strip()
api = os.environ["MTC_API"]
def call(method, path, auth=True):
    url = api + (path if path.startswith("/") else "/v1/" + path)
    req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                                 headers={"Authorization": "Bearer " + token} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
mine = os.environ["MTC_JOB_NAME"]
out = {"get_mine": call("GET", mine), "get_other": call("GET", other),
       "list": call("GET", parent + "/customJobs"), "cancel_other": call("POST", other + ":cancel"),
       "token_file": os.environ["MTC_JOB_TOKEN_FILE"], "name": mine,
       "metrics": [call("GET", "/metrics", False), call("GET", "/metrics")],
       "alerts": [call("GET", "/alerts.json", False), call("GET", "/alerts.json")]}
with open(os.path.join(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/", 1), "calls.json"), "w") as f:
    json.dump(out, f)
"""


def test_a_job_calls_the_api_with_its_own_credential_and_no_more(served: tuple[str, Path]
                                                                 ) -> None:
    """What a job that needs the API gets instead of the admin token: a short-lived token
    for its own job (``$MTC_JOB_TOKEN_FILE``), its name (``$MTC_JOB_NAME``) and the API's URL
    (``$MTC_API``). It reads
    its own job; it can neither read nor cancel another, nor list."""
    url, state = served
    other = _run_job(url, ["true"], bucket_path="other")["name"]
    job = _run_job(url, [sys.executable, "-c", CALL, PARENT, other], bucket_path="calls")
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    calls = json.loads((state / "jobs" / "gcs" / "tenant-bkt" / "calls" / "model" / "calls.json")
                       .read_text())
    assert calls["get_mine"] == 200 and calls["name"] == job["name"], calls
    assert (calls["get_other"], calls["list"], calls["cancel_other"]) == (403, 403, 403), calls
    # defect 5: the fleet's metrics and alerts, from inside a job, on the loopback bind
    assert calls["metrics"] == [401, 403] and calls["alerts"] == [401, 403], calls
    token = Path(calls["token_file"]).read_text().strip()
    own = requests.get(f"{url}/v1/{job['name']}", headers={"Authorization": f"Bearer {token}"},
                       timeout=30)
    assert own.status_code == 200  # good until it expires (an hour), for this job only
    assert requests.get(f"{url}/v1/{other}", headers={"Authorization": f"Bearer {token}"},
                        timeout=30).status_code == 403


FILL = """
import os
with open(os.path.join(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/", 1), "fill.bin"), "ab") as f:
    while True:
        f.write(bytes(1 << 20))
        f.flush()
"""


@ROOT_ONLY
def test_defect_3_a_job_filling_its_disk_twice_leaves_the_state_writable_and_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job outputs are a file system of their own (``mtc serve --jobs-volume on``, the
    default as root): a job that fills it is requeued once (the disk's fault, the first
    time), fills it again and fails as its own failure instead of going round forever; the
    state's store stays writable throughout (creates and ``/readyz`` answer while the
    jobs' file system is full)."""
    from shared.adapters.compute.local import volume

    state = tmp_path / "state"
    jobs = state / "jobs"
    said = volume.ensure(jobs, size_bytes=48 << 20)  # small, so it fills in a moment
    if said != "mounted":
        pytest.skip(f"no volume here: {said}")
    monkeypatch.setenv("MTC_JOBS_VOLUME", "on")
    try:
        with mtc_serve(state, TOKEN) as url:
            create_cluster(url, TOKEN, workers=2)
            fill = jobs / "gcs" / "tenant-bkt" / "fill" / "model" / "fill.bin"
            job = _run_job(url, [sys.executable, "-c", FILL], bucket_path="fill")
            assert job["state"] == "JOB_STATE_FAILED", job
            assert "full again" in job["error"]["message"], job["error"]
            assert fill.exists() and shutil.disk_usage(jobs).free < 4 << 20  # still full
            assert shutil.disk_usage(state).free > 64 << 20  # the state's is not
            made = requests.post(f"{url}/v1beta1/{PARENT}/modelDevelopmentClusters",
                                 params={"modelDevelopmentClusterId": "c2"},
                                 json=cluster_body(workers=1), headers=HEADERS, timeout=30)
            assert made.status_code == 200, made.text
            assert requests.get(f"{url}/readyz", timeout=30).status_code == 200
    finally:
        subprocess.run(["umount", "-l", str(jobs)], check=False, capture_output=True)
        volume.image_of(jobs).unlink(missing_ok=True)


def _server_pid(state: Path) -> int:
    """``mtc serve``'s pid: the process whose command line names this state directory."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmd and str(state).encode() in cmd:
            return int(proc.name)
    raise AssertionError("mtc serve's process was not found")
