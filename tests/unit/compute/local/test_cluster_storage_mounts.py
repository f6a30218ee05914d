"""The cluster's storage as a job on the embedded default sees it: a cluster spec with a
Filestore ``/home``, a Lustre instance and a bucket runs a plain program (no mtc import)
that writes into each, and the files are then in the output root's directories for them.
In a root server's sandbox the job writes at the paths Vertex's nodes have (``/home``, the
Lustre mount point, ``/gcs/<bucket>``); without one, ``MTC_STORAGE_MOUNTS`` gives it the
host directories."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.serving import PARENT, cluster_body

LUSTRE = "projects/p/locations/us-central1-a/instances/lfs"
MOUNTS = ("/home", "/mnt/lustre/lfs", "/gcs/my-data")
# a plain program: writes into each mount and says where it found them
WRITE = textwrap.dedent(
    """
    import json, os, sys
    mounts = json.loads(os.environ["MTC_STORAGE_MOUNTS"])
    for path, where in mounts.items():
        with open(os.path.join(where, "from-job.txt"), "w") as f:
            f.write(path)
    with open(os.path.join(os.environ["AIP_MODEL_DIR"], "mounts.json"), "w") as f:
        json.dump({"mounts": mounts, "uid": os.getuid()}, f)
    """
)


def storage_cluster() -> dict[str, object]:
    body = cluster_body(workers=1)
    body["nodePools"][1]["lustres"] = [LUSTRE]  # type: ignore[index]
    body["orchestratorSpec"]["slurmSpec"]["homeDirectoryStorage"] = (  # type: ignore[index]
        "projects/p/locations/us-central1-a/instances/home")
    body["mtcStorage"] = {"lustreInstances": [{"name": LUSTRE, "perUnitStorageThroughput": 500,
                                               "capacityGib": 18000}],
                          "gcsBuckets": ["my-data"]}
    return body


def run_job(tmp_path: Path, sandboxed: bool) -> tuple[Path, dict[str, object]]:
    """The cluster and the job through the API and the embedded wiring: the output root and
    what the job reported."""
    from services.api.http import create_app
    from services.wiring.api import embedded_api
    from services.wiring.embedded import embedded
    from tests.harness import job_body
    from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config

    state = tmp_path / "state"
    app = embedded(state, config=one_pass_config(), compute_options={"sandboxed": sandboxed})
    ctx, _ = embedded_api(app, env_token=TOKEN)
    client = create_app(ctx).test_client()
    base = f"/v1beta1/{PARENT}"
    out = state / "jobs"
    try:
        made = client.post(f"{base}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                           json=storage_cluster(), headers=AUTH)
        assert made.status_code == 200, made.json
        body = job_body(replicas=1)
        body["jobSpec"]["persistentResourceId"] = "c1"
        pool = body["jobSpec"]["workerPoolSpecs"][0]
        pool["containerSpec"]["command"] = [sys.executable, "-c", WRITE]
        # a spec's own MTC_STORAGE_MOUNTS must bind nothing: the service's replaces it
        pool["containerSpec"]["env"] = [{"name": "MTC_STORAGE_MOUNTS",
                                         "value": json.dumps({"/etc": str(tmp_path)})}]
        made = client.post(f"{base}/customJobs?customJobId=mounts", json=body, headers=AUTH)
        assert made.status_code == 200, made.json
        report = out / "mounts" / "model" / "mounts.json"
        assert app.run(lambda: report.exists(), timeout_s=60), "the job did not run"
        return out, json.loads(report.read_text())
    finally:
        app.compute.kill_all()
        app.close()


def host_dirs(out: Path) -> dict[str, Path]:
    return {"/home": out / "storage" / "c1" / "home",
            "/mnt/lustre/lfs": out / "storage" / "c1" / "lustre" / "lfs",
            "/gcs/my-data": out / "gcs" / "my-data"}


@pytest.mark.slow  # a real worker subprocess
def test_without_a_sandbox_the_job_gets_the_host_directories(tmp_path: Path) -> None:
    out, seen = run_job(tmp_path, sandboxed=False)
    assert seen["mounts"] == {k: str(v.resolve()) for k, v in host_dirs(out).items()}
    for path, where in host_dirs(out).items():
        assert (where / "from-job.txt").read_text() == path


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="the sandbox is for a root server on Linux")
@pytest.mark.slow  # a real worker subprocess, in its mount namespace
def test_in_the_sandbox_the_job_writes_at_home_the_lustre_mount_and_gcs(tmp_path: Path) -> None:
    out, seen = run_job(tmp_path, sandboxed=True)
    assert seen["mounts"] == {m: m for m in MOUNTS}  # the paths Vertex's nodes have
    assert seen["uid"] != 0
    for path, where in host_dirs(out).items():
        assert (where / "from-job.txt").read_text() == path
        assert (where / "from-job.txt").stat().st_uid == seen["uid"]  # the job's own file
    assert not (tmp_path / "from-job.txt").exists()  # the spec's mapping bound nothing


def test_only_the_output_roots_directories_at_storage_paths_are_taken(tmp_path: Path) -> None:
    """What the sandbox binds from ``MTC_STORAGE_MOUNTS``: a directory inside the output
    root, at /home, /gcs/<bucket> or a Lustre mount point; nothing else, whoever wrote it."""
    from shared.adapters.compute.local import sandbox

    out = tmp_path / "jobs"
    asked = {"/home": str(out / "storage" / "c1" / "home"), "/gcs/b": str(out / "gcs" / "b"),
             "/mnt/lustre/l": str(out / "storage" / "c1" / "lustre" / "l"),
             "/etc": str(out / "x"), "/gcs/b/deeper": str(out / "gcs" / "b"),
             "/scratch": "/", "/data": str(out / ".." / "elsewhere"), "/models": str(out)}
    env = {"MTC_STORAGE_MOUNTS": json.dumps(asked)}
    taken = sandbox.storage_mounts(env, str(out))
    assert set(taken) == {"/home", "/gcs/b", "/mnt/lustre/l"}
    assert sandbox.storage_mounts({"MTC_STORAGE_MOUNTS": "not json"}, str(out)) == {}
    assert sandbox.storage_mounts(env, None) == {}
    seen = json.loads(sandbox.seen_in_sandbox(env)["MTC_STORAGE_MOUNTS"])
    assert seen == {k: k for k in asked if k not in ("/etc", "/gcs/b/deeper")}
