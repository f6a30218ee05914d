"""A list and a get cost what they show, not every job stored: the records of a page are a
range of the store's index, page tokens are keyset cursors (stable when jobs come and go), a
filter is pushed down where the store can answer it (``state=``: the jobs' state index, keys
only) and bounded otherwise (a page may be short, with a token to go on from).
``bench/api_load.py`` measures the server under load; docs/server.md has the figures."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from services.api.collection import RENDERED_ITEMS, SCAN_ITEMS
from services.api.context import RESOURCES, resource_key, save_record
from services.api.http import create_app
from services.api.names import Parent
from services.api.paging import cursor_token
from services.wiring.api import embedded_api
from services.wiring.embedded import EmbeddedApp, embedded
from shared.domain.model import Job, JobState
from shared.handling import command_unit
from tests.harness import job_body
from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config
from tests.unit.api.test_list_cost import Quiet

JOBS = 1_000
BASE = f"/v1beta1/{PARENT}/customJobs"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedApp, FlaskClient]]:
    """1,000 finished jobs j0..j999 under the parent (one made through the API, the others
    cloned in the store); j999 is running."""
    app = embedded(tmp_path_factory.mktemp("stored") / "state", config=one_pass_config(),
                   compute_options={"sandboxed": False})
    ctx, _ = embedded_api(app, env_token=TOKEN, runtime=Quiet(app))
    client = create_app(ctx).test_client()
    made = client.post(f"/v1beta1/{PARENT}/modelDevelopmentClusters?modelDevelopmentClusterId"
                       "=c1", json=cluster_body(workers=1), headers=AUTH)
    assert made.status_code == 200, made.json
    app.pump(budget_s=5.0)
    body = job_body(replicas=1)
    body["jobSpec"]["persistentResourceId"] = "c1"
    body["jobSpec"]["workerPoolSpecs"][0]["containerSpec"]["command"] = ["true"]
    made = client.post(f"{BASE}?customJobId=j0", json=body, headers=AUTH)
    assert made.status_code == 200, made.json
    app.pump(budget_s=5.0)
    with command_unit(app.deps) as uow:
        record = uow.record(RESOURCES, resource_key("customJob", "j0"))
        job = uow.jobs.get("j0")
        assert job is not None and record is not None
        job.state = JobState.SUCCEEDED
        for i in range(1, JOBS):
            clone = copy.deepcopy(job)
            clone.job_id = f"j{i}"
            clone.state = JobState.RUNNING if i == JOBS - 1 else JobState.SUCCEEDED
            uow.jobs.add(clone)
            save_record(uow, "customJob", f"j{i}", Parent("p", "l"), record["resource"],
                        record["created"] + i)
    try:
        yield app, client
    finally:
        app.compute.kill_all()
        app.close()


class Decodes:
    """Every JSON document decoded (the store's rows) and every job decoded while on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.documents = 0
        self.jobs: list[str] = []
        loads, from_dict = json.loads, Job.from_dict.__func__  # type: ignore[attr-defined]

        def counted_loads(*args: Any, **kw: Any) -> Any:
            self.documents += 1
            return loads(*args, **kw)

        def counted_job(cls: type[Job], *args: Any, **kw: Any) -> Job:
            self.jobs.append(args[0]["job_id"])
            return from_dict(cls, *args, **kw)  # type: ignore[no-any-return]

        monkeypatch.setattr(json, "loads", counted_loads)
        monkeypatch.setattr(Job, "from_dict", classmethod(counted_job))


def names(page: dict[str, Any]) -> list[str]:
    return [j["name"].rsplit("/", 1)[1] for j in page.get("customJobs", [])]


def get(client: FlaskClient, url: str) -> dict[str, Any]:
    resp = client.get(url, headers=AUTH)
    assert resp.status_code == 200, resp.json
    return resp.json or {}


def test_defect_10_list_costs_a_page_not_every_job(
        stored: tuple[EmbeddedApp, FlaskClient], monkeypatch: pytest.MonkeyPatch) -> None:
    _, client = stored
    decodes = Decodes(monkeypatch)
    page = get(client, f"{BASE}?pageSize=1")
    assert names(page) == ["j0"] and page["nextPageToken"]
    assert decodes.jobs == ["j0"]
    assert decodes.documents < 10, decodes.documents  # was every job and every record: 2,000+
    decodes.documents = 0
    second = get(client, f"{BASE}?pageSize=2&pageToken={page['nextPageToken']}")
    assert names(second) == ["j1", "j2"] and decodes.documents < 10
    decodes.documents = 0
    deep = get(client, f"{BASE}?pageSize=20&pageToken={second['nextPageToken']}")
    assert names(deep) == [f"j{i}" for i in range(3, 23)]
    assert decodes.documents < 50, decodes.documents


def test_defect_10_get_costs_one_job_not_every_job(
        stored: tuple[EmbeddedApp, FlaskClient], monkeypatch: pytest.MonkeyPatch) -> None:
    _, client = stored
    decodes = Decodes(monkeypatch)
    assert get(client, f"{BASE}/j500")["name"].endswith("/customJobs/j500")
    assert decodes.jobs == ["j500"] and decodes.documents < 5, decodes.documents


def test_defect_10_a_state_filter_reads_the_state_index_and_renders_only_its_jobs(
        stored: tuple[EmbeddedApp, FlaskClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """A state few jobs are in: its jobs' ids from the state index, their records by key;
    one call, whatever the list's length."""
    _, client = stored
    decodes = Decodes(monkeypatch)
    page = get(client, f'{BASE}?pageSize=5&filter=state="JOB_STATE_RUNNING"')
    assert names(page) == [f"j{JOBS - 1}"] and not page.get("nextPageToken")
    assert decodes.jobs == [f"j{JOBS - 1}"] and decodes.documents < 10, decodes.documents


def test_defect_10_a_filter_over_many_jobs_is_bounded_per_call(
        stored: tuple[EmbeddedApp, FlaskClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """A state most jobs are in: the records are walked, those its state or display name
    rule out never rendered, and a call stops after SCAN_ITEMS (a short page, even an empty
    one, with a token to go on from)."""
    _, client = stored
    decodes = Decodes(monkeypatch)
    dense = get(client, f'{BASE}?pageSize=3&filter=state="JOB_STATE_SUCCEEDED"')
    assert names(dense) == ["j0", "j1", "j2"] and dense["nextPageToken"]
    assert decodes.jobs == ["j0", "j1", "j2"] and decodes.documents < 20, decodes.documents
    url = f'{BASE}?pageSize=3&filter=state="JOB_STATE_SUCCEEDED" AND displayName="other"'
    token, reads = "", []
    while True:
        decodes.documents = 0
        page = get(client, url + (f"&pageToken={token}" if token else ""))
        reads.append(decodes.documents)
        assert names(page) == []
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert decodes.jobs == ["j0", "j1", "j2"]  # none decoded: the record rules them out
    # the call past the last record also looks for adopted jobs (a projection of the
    # clusters' jobs: job_listing.adopted_records), once per listing
    assert len(reads) <= JOBS // SCAN_ITEMS + 1 and max(reads[:-1]) <= SCAN_ITEMS + 30, reads
    refused = client.get(f'{BASE}?pageSize=3&pageToken={dense["nextPageToken"]}', headers=AUTH)
    assert refused.status_code == 400  # a token is for the filter it was issued with


def test_defect_10_a_filter_it_cannot_push_down_is_bounded_per_call(
        stored: tuple[EmbeddedApp, FlaskClient], monkeypatch: pytest.MonkeyPatch) -> None:
    _, client = stored
    decodes = Decodes(monkeypatch)
    page = get(client, f'{BASE}?pageSize=5&filter=createTime="never"')
    assert names(page) == [] and page["nextPageToken"]  # more may match: go on from here
    assert len(decodes.jobs) <= RENDERED_ITEMS and decodes.documents <= 2 * SCAN_ITEMS


def test_defect_10_page_tokens_stay_put_when_jobs_come_and_go(tmp_path: Path) -> None:
    app = embedded(tmp_path / "state", config=one_pass_config(),
                   compute_options={"sandboxed": False})
    ctx, _ = embedded_api(app, env_token=TOKEN, runtime=Quiet(app))
    client = create_app(ctx).test_client()
    try:
        made = client.post(f"/v1beta1/{PARENT}/modelDevelopmentClusters?"
                           "modelDevelopmentClusterId=c1", json=cluster_body(workers=1),
                           headers=AUTH)
        assert made.status_code == 200, made.json
        body = job_body(replicas=1)
        body["jobSpec"]["persistentResourceId"] = "c1"
        for i in range(5):
            assert client.post(f"{BASE}?customJobId=j{i}", json=body,
                               headers=AUTH).status_code == 200
        first = get(client, f"{BASE}?pageSize=2")
        assert names(first) == ["j0", "j1"]
        with command_unit(app.deps) as uow:  # the first page's jobs go (as a DELETE does)
            for job_id in ("j0", "j1"):
                uow.delete_record(RESOURCES, resource_key("customJob", job_id))
                uow.delete_record("jobs", job_id)
        assert client.post(f"{BASE}?customJobId=j5", json=body, headers=AUTH).status_code == 200
        second = get(client, f"{BASE}?pageSize=2&pageToken={first['nextPageToken']}")
        assert names(second) == ["j2", "j3"]
        third = get(client, f"{BASE}?pageSize=2&pageToken={second['nextPageToken']}")
        assert names(third) == ["j4", "j5"] and not third.get("nextPageToken")
        for bad in (cursor_token(["r", "x"]), cursor_token(["a"]), "not-a-token"):
            assert client.get(f"{BASE}?pageToken={bad}", headers=AUTH).status_code == 400
    finally:
        app.compute.kill_all()
        app.close()
