"""The console's data: bounded at 16,384 nodes, sinfo's words, filters, the run directory,
and the API's auth on every data endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.api.errors import ApiError
from services.api.http import create_app
from services.api.security import TOKENS_FILE
from services.api.tokens import LocalTokens
from services.console import sim, views
from services.console.app import register
from services.presentation.views import iso
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from shared.domain.health import FailureRecord, RepairAction
from shared.domain.model import Node, NodeCondition, NodeRole, NodeState
from shared.policies.repair import RepairConfig
from tests.unit.api.conftest import AUTH, TOKEN, Api, one_pass_config

CFG = RepairConfig()
NOW = 1_000_000.0


def node(i: int, state: NodeState = NodeState.IDLE, partition: str = "gpu", **kw: Any) -> Node:
    return Node(f"n{i:05d}", "c1", "gpu", partition, NodeRole.WORKER, "a3-highgpu-8g",
                "NVIDIA_H100_80GB", 8, state, NOW - 10, **kw)


def test_a_16k_node_grid_is_counts_and_only_the_nodes_that_matter() -> None:
    nodes = [node(i, NodeState.ALLOCATED if i % 2 else NodeState.IDLE,
                  "a" if i < 8192 else "b") for i in range(16_384)]
    for i in range(0, 600, 2):
        nodes[i].state = NodeState.REPAIRING
        nodes[i].repair_action = RepairAction.REBOOT
    nodes[1].alert = "repair held: blast radius"
    nodes[9000].history = [FailureRecord(NOW - 60 * k, "xid", RepairAction.REBOOT)
                           for k in range(1, CFG.lemon_failure_count)]
    nodes[9001].state = NodeState.RETIRED
    grid = views.grid(nodes, NOW, CFG)
    a, b = grid
    assert (a["name"], a["total"], b["total"]) == ("a", 8192, 8191)
    assert a["counts"]["down"] == 300 and a["counts"]["idle"] == 4096 - 300
    assert a["counts"]["alloc"] == 4096 and a["inService"] == 8192 - 300
    assert not a["all"] and a["notableTotal"] == 301 and len(a["notable"]) == views.NOTABLE
    assert a["notable"][0]["sinfo"] == "down" and a["notable"][0]["rung"].startswith("reboot")
    assert [n["id"] for n in b["notable"]] == ["n09000"] and b["notable"][0]["lemon"]
    assert any(n["hold"] for n in a["notable"])
    assert len(json.dumps(grid)) < 100_000  # what one poll carries, whatever the fleet
    page = views.node_page(nodes, NOW, CFG, partition="a", word="down", offset=250, size=100)
    assert page["total"] == 300 and len(page["nodes"]) == 50 and page["next"] is None
    page = views.node_page(nodes, NOW, CFG, partition=None, word=None, offset=0, size=10**6)
    assert len(page["nodes"]) == views.MAX_PAGE and page["next"] == views.MAX_PAGE


def test_sinfo_words_and_small_partitions_list_every_node() -> None:
    words = {s: views.SINFO[s] for s in NodeState}
    assert words[NodeState.IDLE] == "idle" and words[NodeState.ALLOCATED] == "alloc"
    assert words[NodeState.DRAINING] == "drng" and words[NodeState.DRAINED] == "drain"
    assert words[NodeState.REPAIRING] == "down" and words[NodeState.FAILED] == "fail"
    sick = node(2, NodeState.DRAINING)
    sick.conditions = {"XidError": NodeCondition("true", "Xid 79", NOW, NOW),
                       "Thermal": NodeCondition("false", "", NOW, NOW)}
    (p,) = views.grid([node(1), sick], NOW, CFG)
    assert p["all"] and [n["id"] for n in p["notable"]] == ["n00001", "n00002"]
    assert p["notable"][1]["conditions"] == [{"type": "XidError", "reason": "Xid 79",
                                             "since": iso(NOW)}]


def _doc(i: int, type_: str, **data: Any) -> dict[str, Any]:
    return {"id": f"e{i}", "type": type_, "time": NOW + i, "data": data}


def test_timeline_is_newest_first_bounded_and_filtered() -> None:
    docs = [_doc(0, "mtc.job.submitted.v1", job_id="j1", cluster_id="c1"),
            _doc(1, "mtc.node.diagnosed.v1", node_id="n1", failure_mode="gpu_fell_off_bus",
                 severity="critical", action="reboot", observed_at=NOW),
            _doc(2, "mtc.node.health_reported.v1", node_id="n2", source="agent",
                 conditions=[], observed_at=NOW),
            _doc(3, "mtc.node.returned_to_service.v1", node_id="n1"),
            _doc(3, "mtc.node.returned_to_service.v1", node_id="n1")]  # redelivered
    out = views.timeline(docs, views.EventFilter(), 10)
    assert [e["text"] for e in out["events"]] == [
        "node n1: passed its checks, back in service",
        "node n1: diagnosed gpu_fell_off_bus (critical) -> reboot",
        "job j1: submitted to cluster c1"]  # the healthy heartbeat left out
    assert [e["kind"] for e in out["events"]] == ["recovery", "fault", "info"]
    assert views.timeline(docs, views.EventFilter(), 1) == {
        "events": out["events"][:1], "more": True}
    assert len(views.timeline(docs, views.EventFilter(node="n1"), 10)["events"]) == 2
    assert len(views.timeline(docs, views.EventFilter(job="j1"), 10)["events"]) == 1
    assert len(views.timeline(docs, views.EventFilter(type="diagnosed"), 10)["events"]) == 1
    assert len(views.timeline(docs, views.EventFilter(text="BACK IN"), 10)["events"]) == 1
    assert len(views.timeline(docs, views.EventFilter(routine=True), 10)["events"]) == 4
    assert views.belongs(docs[1], "c1", {"n1"}, set())
    assert not views.belongs(docs[2], "c1", {"n1"}, {"j1"})


def test_the_timeline_shows_the_recovery_mode() -> None:
    docs = [_doc(0, "mtc.job.recovery_chosen.v1", job_id="j1", attempt=1, mode="in_place",
                 incident="app_restart", reason="in_place 17.0s = ...", expected_lost_s=17.0),
            _doc(1, "mtc.job.started.v1", job_id="j1", attempt=2, node_ids=["n1"])]
    out = views.timeline(docs, views.EventFilter(), 10)["events"]
    assert [(e["kind"], e["mode"]) for e in out] == [("recovery", None), ("recovery", "in_place")]
    assert "recovery in_place for attempt 1 (app_restart)" in out[1]["text"]


def test_the_run_directory_is_read_with_bounds_and_never_outside(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "sweep").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"goodput": 0.91234, "jobs": {"a": 1}}))
    rows = "\n".join(["x,y", *(f"{i},{i * i}" for i in range(500))])
    (run / "sweep" / "rows.csv").write_text(rows)
    (run / "notes.txt").write_text("not listed")
    (tmp_path / "secret.json").write_text("{}")
    (run / "link.json").symlink_to(tmp_path / "secret.json")
    listing = sim.listing(run)
    assert [f["path"] for f in listing["files"]] == ["summary.json", "sweep/rows.csv"]
    t = sim.table(sim.resolve(run, "sweep/rows.csv"))
    assert t["header"] == ["x", "y"] and len(t["rows"]) == sim.MAX_ROWS and t["truncated"]
    assert sim.table(sim.resolve(run, "summary.json"))["rows"] == [["goodput", "0.9123"],
                                                                   ["jobs.a", "1"]]
    for bad in ("../secret.json", "/etc/passwd", "notes.txt", "", "sweep//rows.csv"):
        with pytest.raises(ApiError) as exc:
            sim.resolve(run, bad)
        assert exc.value.http_status == 400, bad
    for gone in ("link.json", "nope.json"):
        with pytest.raises(ApiError) as exc:
            sim.resolve(run, gone)
        assert exc.value.http_status == 404, gone


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    flask_app = create_app(ctx)
    register(flask_app, ctx, tmp_path / "run")
    yield Api(flask_app.test_client(), app)
    app.compute.kill_all()
    app.close()


def test_every_data_endpoint_needs_a_token_and_a_viewer_binding(api: Api) -> None:
    api.cluster(workers=2)
    page = api.client.get("/console")
    assert page.status_code == 200 and b"console.js" in page.data
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert api.client.get("/console/static/console.js").status_code == 200
    assert api.client.get("/console/static/app.py").status_code == 404
    for path in ("poll", "nodes", "timeline", "sim", "whoami", "job", "history"):
        assert api.client.get(f"/console/api/{path}").status_code == 401, path
        assert api.client.get(f"/console/api/{path}", headers={
            "Authorization": "Bearer wrong"}).status_code == 401, path
    body: Any = api.client.get("/console/api/poll", headers=AUTH).json
    assert [c["id"] for c in body["clusters"]] == ["c1"] and body["grid"][0]["total"] == 2
    assert api.client.get("/console/api/poll", query_string={"cluster": "nonsense"},
                          headers=AUTH).status_code == 400
    bad: Any = api.client.get("/console/api/poll", query_string={"limit": "x"}, headers=AUTH).json
    assert bad["error"]["message"].startswith("limit")
    other = "projects/q/locations/l/modelDevelopmentClusters/c1"
    assert api.client.get("/console/api/nodes", query_string={"cluster": other},
                          headers=AUTH).status_code == 404
    viewer = LocalTokens(api.app.state_dir / TOKENS_FILE).create("token:v", "viewer", "q")
    seen = api.client.get("/console/api/poll", headers={"Authorization": f"Bearer {viewer}"})
    assert seen.status_code == 200 and json.loads(seen.data)["clusters"] == []  # c1: project p
    denied = api.client.get("/console/api/nodes", query_string={
        "cluster": body["cluster"]}, headers={"Authorization": f"Bearer {viewer}"})
    assert denied.status_code == 403


def test_a_cluster_with_a_node_out_does_not_read_all_nodes_in_service(api: Api) -> None:
    api.cluster(workers=2)
    cluster = "/v1beta1/projects/p/locations/l/modelDevelopmentClusters/c1"
    nodes = api.client.get(f"{cluster}/nodes", headers=AUTH).json["nodes"]
    node = next(n["nodeId"] for n in nodes if n["role"] == "worker")
    drained = api.client.post(f"{cluster}/nodes/{node}:drain", json={"reason": "bad fan"},
                              headers=AUTH)
    assert drained.status_code == 200, drained.json
    api.app.pump()
    body: Any = api.client.get("/console/api/poll", headers=AUTH).json
    (shown,) = body["clusters"]
    assert shown["message"] == "1 of 2 nodes in service (1 drained)", shown


def test_no_null_is_handed_to_replace_children() -> None:
    """The DOM's replaceChildren writes a null child as the text "null" (an ended job's
    summary read "overall 0.0 %null" where its cancel button was left out); ``el`` skips
    nulls, replaceChildren does not, so none of its calls may pass one."""
    import re

    static = Path(__file__).resolve().parents[3] / "services" / "console" / "static"
    for path in static.glob("*.js"):
        text = path.read_text()
        for m in re.finditer(r"\.replaceChildren\(", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            args = text[m.end():i - 1]
            top = re.sub(r"el\((?:[^()]|\([^()]*\))*\)", "el()", args)  # el() skips nulls
            assert not re.search(r":\s*null\s*[),]|:\s*null\s*$", top), (path.name, args)


def test_the_cluster_page_shows_its_rollout(api: Api) -> None:
    api.cluster(workers=2)
    cluster = "/v1beta1/projects/p/locations/l/modelDevelopmentClusters/c1"
    body: Any = api.client.get("/console/api/poll", headers=AUTH).json
    assert body["rollout"] is None  # never one
    started = api.client.post(f"{cluster}:rolloutSoftware", headers=AUTH, json={
        "version": {"driver": "560.35"}, "waveSize": 1, "canary": 1})
    assert started.status_code == 200, started.json
    body = api.client.get("/console/api/poll", headers=AUTH).json
    assert body["rollout"] == {"id": "c1.1", "state": "RUNNING",
                               "version": {"driver": "560.35"}, "wave": 1, "waves": 2,
                               "waveSizes": [1, 1], "reason": None, "pausedWave": None}
