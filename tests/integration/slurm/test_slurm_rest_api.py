"""The Slurm Job API against the real slurmrestd of the session's cluster (conftest.py).

scripts/slurm/cluster.sh runs Debian's slurmrestd 22.05 (``-s openapi/v0.0.38``,
``rest_auth/jwt``) as user nobody; mtc's API mints the JWT with ``scontrol token``. A job is
submitted through ``:callSlurmRestApi``, seen in ``squeue``, and cancelled through it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from services.api.http import create_app
from services.api.slurm_rest import CachedToken, SlurmRestConfig, scontrol_token
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.serving import PARENT, cluster_body

from .conftest import Cluster, wait_for

pytestmark = pytest.mark.integration
TOKEN = "it-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALL = f"/v1beta1/{PARENT}/modelDevelopmentClusters/rest1:callSlurmRestApi"


@pytest.fixture
def client(cluster: Cluster, tmp_path: Path) -> Iterator[FlaskClient]:
    if not (cluster.state_dir / "pids" / "slurmrestd.pid").exists():
        pytest.skip("slurmrestd is not installed or did not start (cluster.sh start)")
    url = f"http://127.0.0.1:{int(cluster.env['MTC_SLURM_PORT_BASE']) + 20}"
    app = embedded(tmp_path / "state")
    ctx, _ = embedded_api(app, env_token=TOKEN)
    ctx.slurm_rest = SlurmRestConfig({"rest1": url}, None, "root",
                                     CachedToken(scontrol_token(cluster.slurm_conf), "root"))
    test_client = create_app(ctx).test_client()
    resp = test_client.post(f"/v1beta1/{PARENT}/modelDevelopmentClusters"
                            "?modelDevelopmentClusterId=rest1", json=cluster_body(), headers=AUTH)
    assert resp.status_code == 200, resp.json
    yield test_client
    app.compute.kill_all()
    app.close()


def call(client: FlaskClient, method: str, path: str, body: Any = None) -> dict[str, Any]:
    resp = client.post(CALL, json={"method": f"HTTP_METHOD_{method}", "path": path,
                                   **({"body": body} if body is not None else {})}, headers=AUTH)
    assert resp.status_code == 200, resp.json
    return resp.json  # type: ignore[no-any-return]


def test_submit_see_in_squeue_and_cancel_through_the_api(cluster: Cluster, client: FlaskClient,
                                                         tmp_path: Path) -> None:
    ping = call(client, "GET", "/slurm/v0.0.38/ping")
    assert ping["status"] == 200 and ping["structuredBody"]["pings"][0]["ping"] == "UP", ping
    assert ping["structuredBody"]["meta"]["plugin"]["type"] == "openapi/v0.0.38"
    job = {"script": "#!/bin/bash\nsleep 300\n",
           "job": {"name": "via-slurm-job-api", "partition": "main", "nodes": 1,
                   "current_working_directory": str(tmp_path),
                   "standard_output": str(tmp_path / "rest.out"),
                   "environment": {"PATH": "/usr/bin:/bin"}}}
    submitted = call(client, "POST", "/slurm/v0.0.38/job/submit", job)
    assert submitted["status"] == 200 and not submitted["structuredBody"]["errors"], submitted
    job_id = int(submitted["structuredBody"]["job_id"])
    try:
        seen = next(j for j in cluster.slurm.jobs() if j.job_id == job_id)  # squeue --json
        assert seen.name == "via-slurm-job-api" and seen.partition == "main"
        wait_for(lambda: cluster.slurm.job(job_id).job_state == "RUNNING", 30, "the job running")
        shown = call(client, "GET", f"/slurm/v0.0.38/job/{job_id}")
        assert shown["structuredBody"]["jobs"][0]["job_state"] == "RUNNING", shown
        cancelled = call(client, "DELETE", f"/slurm/v0.0.38/job/{job_id}")
        assert cancelled["status"] == 200 and not cancelled["structuredBody"]["errors"], cancelled
        wait_for(lambda: cluster.slurm.job(job_id).job_state == "CANCELLED", 30, "the job cancelled")
    finally:
        if cluster.slurm.job(job_id).job_state not in ("CANCELLED", "COMPLETED"):
            cluster.slurm.cancel(job_id)
    missing = call(client, "DELETE", "/slurm/v0.0.38/job/999999")
    assert missing["status"] >= 400 and missing["structuredBody"]["errors"], missing
    refused = client.post(CALL, json={"method": "HTTP_METHOD_GET", "path": "/openapi/v3"}, headers=AUTH)
    assert refused.status_code == 400
