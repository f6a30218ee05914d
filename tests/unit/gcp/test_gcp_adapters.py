"""The GCP adapters without the emulators: topology planning, Firestore encoding, settings,
the runtime's publish-after-commit, the outbox sweeper, dead letters, the step endpoints
and the root entry points."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from functions_framework import create_app

from services.health_triage.handlers import on_health_reported
from services.job_submission import commands as job_commands
from services.wiring import runtime as rt_mod
from services.wiring.gcp import GcpRuntime, GcpSettings, NullCompute
from services.wiring.routes import SERVICES, control_plane_routes, families, subscriptions
from shared.adapters import outbox
from shared.adapters import pubsub as ps
from shared.adapters.firestore_store import decode, encode
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.outbox import OUTBOX, make_envelope
from shared.codec import from_pubsub_message, to_pubsub
from shared.domain.errors import ValidationError
from shared.domain.events import Envelope, NodeHealthReported
from shared.domain.model import ClusterState, NodeState
from shared.handling import command_unit, run_handler
from tests.harness import CLUSTER, ManualClock, Plane, job_body, xid

ROOT = Path(__file__).resolve().parents[3]

ROUTES = control_plane_routes()


class Recorder:
    """A publisher that keeps what it was given (and what went to the dead-letter topic)."""

    def __init__(self) -> None:
        self.published: list[Envelope] = []
        self.dead: list[tuple[bytes, dict[str, str]]] = []

    def publish(self, envelope: Envelope) -> None:
        self.published.append(envelope)

    def publish_dead_letter(self, data: bytes, attributes: dict[str, str]) -> None:
        self.dead.append((data, dict(attributes)))


# ---------------------------------------------------------------- topology


def test_one_subscription_per_service_and_family() -> None:
    plans = ps.plan_subscriptions(ROUTES)
    assert {(p.service, p.family) for p in plans} == {
        (s, f) for f, services in families().items() for s in services}
    assert len({p.name for p in plans}) == len(plans)
    for plan in plans:
        assert plan.topic == f"mtc-{plan.family}" and len(plan.name) >= 3
        assert set(plan.types) == {t for t in subscriptions(plan.service)
                                   if t.split(".")[1] == plan.family}
        if plan.filter:
            assert len(plan.filter.encode()) <= ps.FILTER_LIMIT
            assert all(f'"{t}"' in plan.filter for t in plan.types)


def test_filters_too_long_for_pubsub_are_left_out() -> None:
    assert ps.message_filter([f"mtc.node.type_{i}.v1" for i in range(20)]) == ""
    assert ps.message_filter(["mtc.job.started.v1"]) == 'attributes."ce-type" = "mtc.job.started.v1"'


def test_names() -> None:
    assert ps.topics(ROUTES) == sorted(f"mtc-{f}" for f in families())
    assert ps.subscription_id("health_triage", "node") == "mtc-health-triage-node"
    assert ps.function_name("checkpoint_resume") == "mtc-checkpoint-resume"
    assert ps.dead_letter_topic_id() == "mtc-dead-letter"


# ---------------------------------------------------------------- firestore encoding


def test_nested_arrays_and_sets_survive_firestore_encoding() -> None:
    doc = {"a": [[1, 2], [3]], "s": {"x", "y"}, "m": {"k": [{"z": [[0]]}]}, "n": None}
    encoded = encode(doc)
    assert encoded["a"] == [{"~list": [1, 2]}, {"~list": [3]}]
    assert encoded["s"] == ["x", "y"]
    assert decode(encoded) == {"a": [[1, 2], [3]], "s": ["x", "y"], "m": {"k": [{"z": [[0]]}]},
                               "n": None}


# ---------------------------------------------------------------- settings


def test_settings_from_env() -> None:
    with pytest.raises(RuntimeError, match="GOOGLE_CLOUD_PROJECT"):
        GcpSettings.from_env({})
    with pytest.raises(RuntimeError, match="MTC_COMPUTE"):
        GcpSettings.from_env({"GOOGLE_CLOUD_PROJECT": "p", "MTC_COMPUTE": "gce"})
    s = GcpSettings.from_env({"GOOGLE_CLOUD_PROJECT": "p", "K_SERVICE": "mtc-repair",
                              "MTC_COMPUTE": "none", "MTC_GRACE_PERIOD_S": "5",
                              "MTC_REPAIR_CONFIG": '{"return_after_passes": 3}'})
    assert (s.project, s.source, s.compute, s.grace_period_s) == \
        ("p", "//mtc/mtc-repair", "none", 5.0)
    rt = GcpRuntime(s, store=MemoryDocStore(), publisher=Recorder())  # type: ignore[arg-type]
    assert rt.deps.config.grace_period_s == 5.0
    assert rt.deps.config.repair.return_after_passes == 3
    assert isinstance(rt.compute, NullCompute)


# ---------------------------------------------------------------- runtime


@pytest.fixture
def gcp() -> Iterator[tuple[Plane, GcpRuntime, Recorder]]:
    plane = Plane().up()
    recorder = Recorder()
    rt = GcpRuntime(GcpSettings("p", compute="none"), store=plane.store,
                    publisher=recorder, compute=plane.compute,  # type: ignore[arg-type]
                    clock=plane.clock, config=plane.deps.config)
    yield plane, rt, recorder


def test_handler_events_are_published_once_after_commit(
        gcp: tuple[Plane, GcpRuntime, Recorder]) -> None:
    plane, rt, recorder = gcp
    env = make_envelope(NodeHealthReported(node_id="c1-gpu-001", observed_at=plane.clock.now(),
                                           conditions=xid(79, plane.clock.now())),
                        "//test", plane.clock.now())
    assert run_handler("health_triage", on_health_reported, env, rt.deps).value == "handled"
    rt.after_request()
    assert [e.type for e in recorder.published] == ["mtc.node.diagnosed.v1"]
    assert plane.store.read(OUTBOX, {}) == []  # published, so gone from the outbox


def test_api_commands_are_published_once_after_their_commit(
        gcp: tuple[Plane, GcpRuntime, Recorder]) -> None:
    _, rt, recorder = gcp
    with command_unit(rt.deps) as uow:
        job_commands.submit_job("c1", job_body(1), uow, rt.deps, "j1")
        assert recorder.published == []  # nothing before the commit
    assert [e.type for e in recorder.published] == ["mtc.job.submitted.v1"]
    assert rt.store.read(OUTBOX, {}) == []  # published, so gone from the outbox
    rt.after_request()
    assert len(recorder.published) == 1  # nothing twice


def test_a_failed_command_publishes_nothing(gcp: tuple[Plane, GcpRuntime, Recorder]) -> None:
    _, rt, recorder = gcp
    with pytest.raises(ValidationError), command_unit(rt.deps) as uow:
        job_commands.submit_job("c1", {"displayName": "x"}, uow, rt.deps, "j2")
    assert recorder.published == []
    assert rt.store.read(OUTBOX, {}) == []


def test_sweeper_publishes_what_a_crash_left_and_respects_min_age() -> None:
    store = MemoryDocStore()
    clock = ManualClock()
    env = make_envelope(NodeHealthReported(node_id="n", observed_at=clock.now(),
                                           conditions=()), "//test", clock.now())
    outbox.leave_in_outbox(store, env)
    recorder = Recorder()
    assert outbox.sweep_outbox(store, recorder, min_age_s=10, now=clock.now() + 5) == 0
    assert outbox.sweep_outbox(store, recorder, min_age_s=10, now=clock.now() + 11) == 1
    assert [e.id for e in recorder.published] == [env.id]
    assert store.read(OUTBOX, {}) == []


def test_permanent_failures_go_to_the_dead_letter_topic_with_the_reason() -> None:
    store = MemoryDocStore()
    recorder = Recorder()
    letters = ps.PubSubDeadLetters(store, recorder)  # type: ignore[arg-type]
    env = make_envelope(NodeHealthReported(node_id="n", observed_at=1.0, conditions=()),
                        "//test", 1.0)
    letters.dead_letter(env, "repair", "node n not found")
    letters.dead_letter(None, "repair", "data: is not JSON", raw={"x": 1})
    (data, attrs), (raw, raw_attrs) = recorder.dead
    assert attrs["mtc-reason"] == "node n not found" and attrs["mtc-service"] == "repair"
    assert from_pubsub_message({"attributes": attrs, "data": data}).id == env.id
    assert json.loads(raw)["raw"] == "{'x': 1}" and raw_attrs["mtc-service"] == "repair"
    assert len(letters.list()) == 2


def test_binary_mode_attributes_round_trip() -> None:
    env = make_envelope(NodeHealthReported(node_id="n", observed_at=1.0, conditions=()),
                        "//test", 1.0)
    data, attrs = to_pubsub(env)
    assert attrs["ce-type"] == env.type and attrs["ce-id"] == env.id
    assert from_pubsub_message({"attributes": attrs, "data": data}) == env


# ---------------------------------------------------------------- step endpoints


class PlaneRuntime:
    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.deps = plane.deps

    def after_request(self) -> None:
        self.plane.deliver()


@pytest.fixture
def steps() -> Iterator[tuple[Plane, FlaskClient]]:
    plane = Plane()
    rt_mod.install(PlaneRuntime(plane))
    app = create_app("steps", str(ROOT / "main.py"), "http")  # type: ignore[no-untyped-call]
    yield plane, app.test_client()
    rt_mod.install(None)


def post(client: FlaskClient, path: str, body: Any) -> tuple[int, Any]:
    resp = client.post(path, data=json.dumps(body), content_type="application/json")
    return resp.status_code, resp.get_json()


def test_steps_drive_provisioning_to_ready(steps: tuple[Plane, FlaskClient]) -> None:
    plane, client = steps
    cluster = plane.api(job_commands.create_cluster, CLUSTER)
    plane.bus.outbox.mark_published([e.id for e in plane.bus.outbox.pending()])
    ids = {"cluster_id": "c1", "generation": cluster.generation}
    assert post(client, "/steps/validate", ids) == (
        200, {"proceed": True, "state": "PROVISIONING", "generation": 1})
    assert post(client, "/steps/create_nodes", ids) == (200, {"requested": 5})
    assert post(client, "/steps/create_nodes", ids) == (200, {"requested": 0})  # idempotent
    code, status = post(client, "/steps/status", ids)
    assert code == 200 and status["done"] is False and status["settling"] == 5
    code, health = post(client, "/steps/health_check", ids)
    assert health["healthy"] is False and "settling" in health["reason"]
    plane.bring_up()
    assert post(client, "/steps/status", ids)[1]["done"] is True
    assert post(client, "/steps/health_check", ids)[1]["healthy"] is True
    assert post(client, "/steps/mark_ready", ids) == (200, {"ready": True, "state": "READY"})
    assert post(client, "/steps/validate", ids)[1]["proceed"] is False


def test_rollback_retires_what_the_generation_created(steps: tuple[Plane, FlaskClient]) -> None:
    plane, client = steps
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.bus.outbox.mark_published([e.id for e in plane.bus.outbox.pending()])
    ids = {"cluster_id": "c1", "generation": 1}
    post(client, "/steps/create_nodes", ids)
    assert post(client, "/steps/rollback", {**ids, "reason": "timed out"}) == \
        (200, {"state": "FAILED"})
    assert all(n.state is NodeState.RETIRED for n in plane.nodes("c1"))
    with plane.uow() as uow:
        cluster = uow.clusters.get("c1")
    assert cluster is not None and cluster.state is ClusterState.FAILED
    assert "timed out" in cluster.message


def test_step_errors(steps: tuple[Plane, FlaskClient]) -> None:
    _, client = steps
    assert post(client, "/steps/status", {"cluster_id": "nope"})[0] == 404
    assert post(client, "/steps/create_nodes", {"cluster_id": "c1"})[0] == 400
    assert post(client, "/steps/launch", {})[0] == 404
    resp = client.post("/steps/status", data="{", content_type="application/json")
    assert resp.status_code == 400
    assert client.get("/steps/status").status_code == 405


def test_tick_queues_a_fleet_tick_per_live_cluster(steps: tuple[Plane, FlaskClient]) -> None:
    plane, client = steps
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()
    code, body = post(client, "/tick", {})
    assert code == 200 and body == {"ticked": ["c1"], "swept": 0}
    assert any(e.type == "mtc.fleet.ticked.v1" for e in plane.delivered)


# ---------------------------------------------------------------- root entry points


def test_root_entry_points_have_their_own_signature() -> None:
    import functions_framework._function_registry as registry

    main = root_main()

    for name, kind in main.ENTRY_POINTS.items():
        assert callable(getattr(main, name))
        assert registry.REGISTRY_MAP[name] == kind
    assert set(main.ENTRY_POINTS) == {*SERVICES, "api", "steps"}


def test_root_main_only_re_exports_the_one_layer_of_entry_points() -> None:
    """One layer of function entry points: the root main.py defines no function of its own,
    and no service package keeps a main.py of its own above the wiring."""
    from services import functions

    main = root_main()
    assert main.ENTRY_POINTS is functions.ENTRY_POINTS
    for name in functions.ENTRY_POINTS:
        assert getattr(main, name) is getattr(functions, name)
    # (the CLI's and the executor's main.py are programs, not functions)
    mains = {str(p.relative_to(ROOT)) for p in (ROOT / "services").glob("*/*main.py")}
    assert mains == {"services/cli/main.py", "services/executor/main.py"}


def root_main() -> Any:
    """The repository's main.py, by path: functions-framework registers every source it loads
    as the module ``main``, so ``import main`` may find what another test loaded."""
    import importlib.util

    path = ROOT / "main.py"
    spec = importlib.util.spec_from_file_location("mtc_root_main", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cloud_runtime_keeps_the_event_log(gcp: tuple[Plane, GcpRuntime, Recorder]) -> None:
    """The cloud path: no bus delivers in the cloud, so the event log (timelines,
    goodput, the event-derived metrics) stayed empty there. Every event a function handled
    and every event the control plane published is logged once (redelivery and several
    functions included); the fault-to-drain histogram that reads the log is no longer
    empty."""
    from services.observability import metrics
    from shared.codec import to_cloudevent

    plane, rt, recorder = gcp
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    now = plane.clock.now()
    report = make_envelope(NodeHealthReported(node_id="c1-gpu-001", observed_at=now,
                                              conditions=xid(79, now)), "//test", now)
    delivered: set[str] = set()
    queue = [report]
    while queue:  # what Pub/Sub would push: each event to every function subscribed to it
        env = queue.pop(0)
        for service in SERVICES:
            if subscriptions(service).get(env.type) is not None:
                rt_mod.handle_cloud_event(service, to_cloudevent(env), rt)
        delivered.add(env.id)
        queue += [e for e in recorder.published if e.id not in delivered and e not in queue]
    assert rt_mod.handle_cloud_event("health_triage", to_cloudevent(report), rt) == "duplicate"
    ours = {report.id} | {e.id for e in recorder.published}  # the plane logs its own too

    def logged() -> list[dict[str, Any]]:
        return [d for d in rt.event_log.read() if d["id"] in ours]

    ids = [d["id"] for d in logged()]
    assert len(ids) == len(set(ids)), ids  # once each
    assert set(ids) == ours, {e.type for e in recorder.published if e.id not in ids}
    assert {"mtc.node.health_reported.v1", "mtc.node.diagnosed.v1",
            "mtc.node.draining.v1"} <= {d["type"] for d in logged()}
    text = metrics.render(metrics.registry(rt.store, rt.clock, event_log=rt.event_log)).decode()
    assert "mtc_fault_to_drain_seconds_count 1.0" in text, text
