"""The console's job page, history and actions: what the page shows
and acts on, through the real API, store and event log."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.api.audit import AuditLog
from services.api.http import create_app
from services.api.security import TOKENS_FILE
from services.api.tokens import LocalTokens
from services.console import jobpage
from services.console.app import register
from services.console.history import MAX_POINTS, History, Sampler, fault_to_drain, series
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from shared.adapters.compute.worker_logs import LogFile
from shared.domain.health import Condition, ConditionStatus, ConditionType
from tests.cli_support import job_body
from tests.serving import PARENT
from tests.unit.api.conftest import AUTH, TOKEN, Api, one_pass_config

NOW = 1_000_000.0
C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
CLUSTER = f"{PARENT}/modelDevelopmentClusters/c1"


def _doc(i: float, type_: str, **data: Any) -> dict[str, Any]:
    return {"id": f"e{i}", "type": type_, "time": NOW + i, "data": data}


def test_fault_to_drain_pairs_a_diagnosis_with_the_nodes_next_drain() -> None:
    docs = [_doc(0, "mtc.node.diagnosed.v1", node_id="n1", action="reboot", observed_at=NOW),
            _doc(1, "mtc.node.diagnosed.v1", node_id="n2", action="none", observed_at=NOW),
            _doc(2, "mtc.node.drained.v1", node_id="n2"),  # no fault: an operator's drain
            _doc(4.5, "mtc.node.drained.v1", node_id="n1"),
            _doc(5, "mtc.node.diagnosed.v1", node_id="n3", action="replace", observed_at=NOW + 5),
            _doc(20, "mtc.node.drained.v1", node_id="n3")]
    assert fault_to_drain(docs, NOW, NOW + 10, {"n1", "n2", "n3"}) == [4.5]
    assert fault_to_drain(docs, NOW + 10, NOW + 30, {"n1", "n2", "n3"}) == [15.0]
    assert fault_to_drain(docs, NOW, NOW + 30, {"n2"}) == []


def test_history_is_cut_to_bounded_series_and_pruned_by_its_retention(tmp_path: Path) -> None:
    app = embedded(tmp_path / "state", config=one_pass_config())
    try:
        history = History(app.store, interval_s=10, retention_s=1000)
        for k in range(600):
            history.write({"cluster": "c1", "time": NOW + k, "held": k % 2, "goodput": 50.0,
                           "nodes": {"idle": 3, "alloc": k % 4}, "faultToDrainS": [k / 10]})
        history.write({"cluster": "c2", "time": NOW, "nodes": {}, "faultToDrainS": []})
        samples = history.read("c1", NOW + 100)
        assert len(samples) == 500 and samples[0]["time"] == NOW + 100
        s = series(samples)
        assert len(s["times"]) <= MAX_POINTS and s["times"][-1] == NOW + 599  # newest kept
        assert s["nodes"]["drng"] == [0] * len(s["times"])  # an empty state is zeros
        assert len(s["faultToDrain"]) == MAX_POINTS
        assert min(p["seconds"] for p in s["faultToDrain"]) == (600 - MAX_POINTS) / 10  # slowest
        assert history.prune(NOW + 1100) == 100 + 1  # c1's first 100 and c2's only sample
        assert len(history.read("c1", 0)) == 500 and history.read("c2", 0) == []
        with pytest.raises(ValueError):
            History(app.store, interval_s=10, retention_s=5)
    finally:
        app.close()


def test_job_page_attempts_incidents_and_log_tails(tmp_path: Path) -> None:
    docs = [_doc(0, "mtc.job.started.v1", job_id="j1", attempt=1, node_ids=["n1", "n2"]),
            _doc(8, "mtc.node.draining.v1", job_id="j1", node_id="n1", reason="xid"),
            _doc(10, "mtc.job.interrupt_requested.v1", job_id="j1", attempt=1, node_id="n1",
                 reason="xid"),
            _doc(12, "mtc.job.recovery_chosen.v1", job_id="j1", attempt=1, mode="requeue",
                 incident="node_fault", reason="requeue 30 s < ...", expected_lost_s=30.0),
            _doc(13, "mtc.job.workers_exited.v1", job_id="j1", attempt=1, exit_code=143),
            _doc(13, "mtc.job.workers_exited.v1", job_id="j1", attempt=1, exit_code=143),
            _doc(25, "mtc.job.started.v1", job_id="j1", attempt=2, node_ids=["n3", "n2"],
                 resume_step=40),
            _doc(26, "mtc.job.started.v1", job_id="other", attempt=1, node_ids=["n9"])]
    a = jobpage.attempts(docs, "j1")
    assert [(x["attempt"], x["nodes"], x["resumeStep"], x["exitCode"]) for x in a] == [
        (1, ["n1", "n2"], None, 143), (2, ["n3", "n2"], 40, None)]
    assert [x["resume"] for x in a] == ["from scratch", "step 40"]
    later = _doc(30, "mtc.job.started.v1", job_id="j1", attempt=3, node_ids=["n3"])
    assert jobpage.attempts([*docs, later], "j1")[-1]["resume"] == \
        "no checkpoint recognised (see docs/pytorch.md)"
    (i,) = jobpage.incidents(docs, "j1")
    assert (i["attempt"], i["mode"], i["incident"], i["recoveryS"]) == (
        1, "requeue", "node_fault", 17.0)  # from the drain to attempt 2's start
    big = tmp_path / "rank0.log"
    big.write_text("".join(f"line {k}\n" for k in range(100_000)))
    small = tmp_path / "rank1.log"
    small.write_text("only\n")
    tails = jobpage.log_tails([LogFile(1, 0, str(small), True), LogFile(2, 1, str(small), False),
                               LogFile(2, 0, str(big), False)], lines=3)
    assert tails["attempt"] == 2
    assert [(r["rank"], r["lines"]) for r in tails["ranks"]] == [
        (0, ["line 99997", "line 99998", "line 99999"]), (1, ["only"])]
    assert jobpage.tail(tmp_path / "gone.log") == []


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    flask_app = create_app(ctx)
    register(flask_app, ctx, None, History(app.store))
    yield Api(flask_app.test_client(), app)
    app.compute.kill_all()
    app.close()


def _poll(api: Api) -> Any:
    resp = api.client.get("/console/api/poll", query_string={"cluster": CLUSTER}, headers=AUTH)
    assert resp.status_code == 200, resp.json
    return resp.json


def test_a_held_repair_shows_with_its_release_and_actions_are_audited(api: Api) -> None:
    api.cluster(workers=4)
    workers = [n["nodeId"] for n in api.call("GET", f"{C}/nodes").json["nodes"]
               if n["role"] == "worker"]
    for node in workers[:2]:  # the guard allows one of four out at a time: one is held
        api.app.compute.inject_fault(node, [Condition(
            ConditionType.XID_ERROR.value, ConditionStatus.TRUE, "Xid 79", time.time(),
            {"xids": [79]})])
    for _ in range(100):
        body = _poll(api)
        if body["held"]["count"]:
            break
        api.app.pump(budget_s=0.2)
        time.sleep(0.05)
    assert body["held"]["count"] == 1, body["held"]
    (held,) = body["held"]["nodes"]
    (c1,) = body["clusters"]
    assert c1["message"].startswith("1 repair held by the blast-radius guard")
    assert "all nodes in service" not in c1["message"]
    cell = next(n for p in body["grid"] for n in p["notable"] if n["id"] == held)
    assert cell["held"] and not cell["operatorDrained"]

    viewer = LocalTokens(api.app.state_dir / TOKENS_FILE).create("token:v", "viewer", "p")
    as_viewer = {"Authorization": f"Bearer {viewer}"}
    refused = api.call("POST", f"{C}/nodes/{held}:releaseHold", {"reason": "seen it"},
                       headers=as_viewer)
    assert refused.status_code == 403, refused.json
    released = api.call("POST", f"{C}/nodes/{held}:releaseHold", {"reason": "let it repair"})
    assert released.status_code == 200, released.json
    audit = [(r["who"], r["status"], r.get("reason")) for r in AuditLog(api.app.store, 3600).read()
             if r["resource"].endswith(f"{held}:releaseHold")]
    assert audit == [("token:v", 403, "seen it"), ("token:env-admin", 200, "let it repair")]
    assert _poll(api)["held"]["count"] == 0


def test_job_page_and_cancel_with_a_reason(api: Api) -> None:
    api.cluster(workers=2)
    body = job_body(2000, "c1")
    body["jobSpec"]["scheduling"]["mtcPartition"] = "gpu"
    resp = api.call("POST", f"/v1/{PARENT}/customJobs?customJobId=long", body)
    assert resp.status_code == 200, resp.json
    for _ in range(200):
        api.app.pump(budget_s=0.2)
        row = next(j for j in _poll(api)["jobs"]["items"] if j["id"] == "long")
        if row["state"] == "JOB_STATE_RUNNING":
            break
        time.sleep(0.05)
    assert row["name"] == f"{PARENT}/customJobs/long"
    page: Any = api.client.get("/console/api/job", query_string={"cluster": CLUSTER, "job": "long"},
                          headers=AUTH)
    assert page.status_code == 200, page.json
    assert [a["attempt"] for a in page.json["attempts"]] == [1] and page.json["logsKept"]
    missing = api.client.get("/console/api/job", query_string={"cluster": CLUSTER, "job": "x"},
                             headers=AUTH)
    assert missing.status_code == 404
    cancelled = api.call("POST", f"/v1/{row['name']}:cancel", {"reason": "wrong dataset"})
    assert cancelled.status_code == 200, cancelled.json
    (record,) = [r for r in AuditLog(api.app.store, 3600).read()
                 if r["resource"].endswith("customJobs/long:cancel")]
    assert (record["status"], record.get("reason")) == (200, "wrong dataset")


def test_charts_read_the_stored_history(api: Api) -> None:
    api.cluster(workers=2)
    history = History(api.app.store, interval_s=1, retention_s=3600)
    deps = api.app.deps
    now = deps.clock.now()
    assert history.sample_if_due(deps.uow, deps.event_log, now) == 1
    assert history.sample_if_due(deps.uow, deps.event_log, now + 0.5) == 0  # not due
    assert history.sample_if_due(deps.uow, deps.event_log, now + 1) == 1
    resp = api.client.get("/console/api/history", query_string={"cluster": CLUSTER},
                          headers=AUTH)
    assert resp.status_code == 200, resp.json
    h: Any = resp.json
    assert h["enabled"] and h["samples"] == 2 and h["nodes"]["idle"] == [2, 2]
    assert h["goodput"] == [None, None]  # nothing running
    bad: Any = api.client.get("/console/api/history", query_string={
        "cluster": CLUSTER, "windowS": "5"}, headers=AUTH)
    assert bad.status_code == 400 and "windowS" in bad.json["error"]["message"]
    assert api.client.get("/console/api/history", query_string={
        "cluster": CLUSTER}).status_code == 401


def test_the_sampler_samples_on_its_own_thread_until_stopped(api: Api) -> None:
    api.cluster(workers=1)
    deps = api.app.deps
    history = History(api.app.store, interval_s=0.05, retention_s=60)
    sampler = Sampler(history, deps.uow, deps.event_log, deps.clock).start()
    try:
        deadline = time.monotonic() + 10
        while len(history.read("c1", 0)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
    assert len(history.read("c1", 0)) >= 3
    assert sampler._thread is not None and not sampler._thread.is_alive()


def test_a_requeue_with_nothing_else_to_weigh_is_an_incident_too() -> None:
    """A plain requeue records no choice when requeue is the only option (no peer copy, not
    elastic): the job page still shows the incident, as a requeue, with its reason."""
    docs = [_doc(0, "mtc.job.started.v1", job_id="j1", attempt=1, node_ids=["n1"]),
            _doc(8, "mtc.node.draining.v1", job_id="j1", node_id="n1", reason="xid 79"),
            _doc(9, "mtc.job.workers_exited.v1", job_id="j1", attempt=1, exit_code=75),
            _doc(9.5, "mtc.job.requeued.v1", job_id="j1", reason="gpu_fell_off_bus: reboot"),
            _doc(12, "mtc.job.started.v1", job_id="j1", attempt=2, node_ids=["n2"])]
    (i,) = jobpage.incidents(docs, "j1")
    assert (i["attempt"], i["mode"], i["reason"], i["recoveryS"]) == (
        1, "requeue", "gpu_fell_off_bus: reboot", 4.0)


def test_a_server_assigned_job_is_shown_by_the_id_the_api_takes(api: Api) -> None:
    """Vertex names a CustomJob by a number: the console, the timeline and the node list
    show that number (never the domain's ``cj-<number>``), and the API answers to it."""
    api.cluster(workers=2)
    body = job_body(2000, "c1")
    body["jobSpec"]["scheduling"]["mtcPartition"] = "gpu"
    resp = api.call("POST", f"/v1/{PARENT}/customJobs", body)
    assert resp.status_code == 200, resp.json
    number = resp.json["name"].rsplit("/", 1)[-1]
    assert number.isdigit()
    for _ in range(200):
        api.app.pump(budget_s=0.2)
        poll = _poll(api)
        row = next(j for j in poll["jobs"]["items"] if j["name"] == resp.json["name"])
        if row["state"] == "JOB_STATE_RUNNING":
            break
        time.sleep(0.05)
    assert row["id"] == number
    assert api.call("GET", f"/v1/{PARENT}/customJobs/{row['id']}").status_code == 200
    lines = [e["text"] for e in poll["timeline"]["events"] if e["job"]]
    assert lines and all("cj-" not in t for t in lines), lines
    assert all(e["job"] == number for e in poll["timeline"]["events"] if e["job"])
    assert any(t.startswith(f"job {number}: attempt 1 started") for t in lines), lines
    nodes = api.call("GET", f"{C}/nodes").json["nodes"]
    assert {n.get("job") for n in nodes if n.get("job")} == {number}
    page: Any = api.client.get("/console/api/job", query_string={"cluster": CLUSTER,
                               "job": number}, headers=AUTH)
    assert page.status_code == 200 and page.json["job"]["id"] == number, page.json
