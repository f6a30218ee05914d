"""Lists cost the whole collection. ``customJobs?pageSize=1`` read every job
of the parent (and every job of its clusters, to find adopted ones) before cutting the page:
120 ms at 1,000 jobs, 907 ms at 5,000. A page now reads the jobs it shows
(``bench/list_bench.py`` measures it; docs/scale.md has the figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.api.http import create_app
from services.console.app import JOBS_PAGE, register
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from shared.domain.model import Job
from tests.harness import job_body
from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config


class Quiet:
    """Delivers nothing after a call: what the GET itself reads, not the control plane's."""

    def __init__(self, app: Any) -> None:
        self.app, self.deps, self.store = app, app.deps, app.store

    def after_request(self) -> None:
        pass


def test_defect_4_a_list_page_of_one_reads_one_job_not_the_collection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = embedded(tmp_path / "state", config=one_pass_config(), compute_options={
        "sandboxed": False})
    ctx, _ = embedded_api(app, env_token=TOKEN, runtime=Quiet(app))
    client = create_app(ctx).test_client()
    base = f"/v1beta1/{PARENT}"
    try:
        made = client.post(f"{base}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                           json=cluster_body(workers=1), headers=AUTH)
        assert made.status_code == 200, made.json
        body = job_body(replicas=1)
        body["jobSpec"]["persistentResourceId"] = "c1"
        for i in range(6):
            made = client.post(f"{base}/customJobs?customJobId=j{i}", json=body, headers=AUTH)
            assert made.status_code == 200, made.json
        app.pump(budget_s=5.0)
        loads = []
        real = Job.from_dict.__func__  # type: ignore[attr-defined]

        def counted(cls: type[Job], *args: Any, **kw: Any) -> Job:
            loads.append(args[0]["job_id"])
            return real(cls, *args, **kw)  # type: ignore[no-any-return]

        monkeypatch.setattr(Job, "from_dict", classmethod(counted))
        resp = client.get(f"{base}/customJobs?pageSize=1", headers=AUTH)
        assert resp.status_code == 200, resp.json
        page: dict[str, Any] = resp.json or {}
        assert [j["name"].rsplit("/", 1)[1] for j in page["customJobs"]] == ["j0"]
        assert page["nextPageToken"]
        assert loads == ["j0"]  # the page's job, not all six
        second: dict[str, Any] = client.get(f"{base}/customJobs?pageSize=1&pageToken="
                                            f"{page['nextPageToken']}", headers=AUTH).json or {}
        assert [j["name"].rsplit("/", 1)[1] for j in second["customJobs"]] == ["j1"]
    finally:
        app.compute.kill_all()
        app.close()


def test_defect_4_the_consoles_poll_reads_the_jobs_it_shows_not_the_clusters_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = embedded(tmp_path / "state", config=one_pass_config(), compute_options={
        "sandboxed": False})
    ctx, _ = embedded_api(app, env_token=TOKEN, runtime=Quiet(app))
    flask_app = create_app(ctx)
    register(flask_app, ctx, tmp_path / "run")
    client = flask_app.test_client()
    base = f"/v1beta1/{PARENT}"
    try:
        made = client.post(f"{base}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                           json=cluster_body(workers=1), headers=AUTH)
        assert made.status_code == 200, made.json
        body = job_body(replicas=1)
        body["jobSpec"]["persistentResourceId"] = "c1"
        total = JOBS_PAGE + 5
        for i in range(total):
            made = client.post(f"{base}/customJobs?customJobId=j{i}", json=body, headers=AUTH)
            assert made.status_code == 200, made.json
        app.pump(budget_s=5.0)
        loads: list[str] = []
        real = Job.from_dict.__func__  # type: ignore[attr-defined]

        def counted(cls: type[Job], *args: Any, **kw: Any) -> Job:
            loads.append(args[0]["job_id"])
            return real(cls, *args, **kw)  # type: ignore[no-any-return]

        monkeypatch.setattr(Job, "from_dict", classmethod(counted))
        resp = client.get("/console/api/poll", headers=AUTH)
        assert resp.status_code == 200, resp.json
        jobs: dict[str, Any] = (resp.json or {})["jobs"]
        assert jobs["total"] == total and len(jobs["items"]) == JOBS_PAGE
        assert len(loads) == JOBS_PAGE  # the page's jobs, not all of the cluster's
    finally:
        app.compute.kill_all()
        app.close()
