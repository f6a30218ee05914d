"""At-least-once delivery through the real emulators: Pub/Sub push to functions-framework
apps served over HTTP, handlers over Firestore transactions.

Duplicate delivery, redelivery after a handler raised, out-of-order delivery, a poison
event ending in the dead-letter topic (after max delivery attempts, and at once for a
malformed one), a crash between commit and publish recovered by the outbox sweeper, and
two concurrent handlers on the same node. Nothing lost, nothing applied twice.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from gcp_support import (
    PROJECT,
    SafeCompute,
    Server,
    StorePlane,
    firestore_store,
    function_app,
    reset_firestore,
    wait_for,
)
from werkzeug.middleware.dispatcher import DispatcherMiddleware

import services.wiring.runtime as rt_mod
from services.health_triage.handlers import on_health_reported
from services.wiring.gcp import GcpRuntime, GcpSettings
from services.wiring.routes import SERVICES, control_plane_routes
from shared.adapters import outbox
from shared.adapters import pubsub as ps
from shared.adapters.docstore import PROCESSED
from shared.adapters.firestore_store import Contention, FirestoreDocStore
from shared.adapters.outbox import OUTBOX, make_envelope
from shared.codec import from_pubsub_message
from shared.domain.events import Envelope, Event, NodeHealthReported
from shared.domain.health import RepairAction
from shared.domain.model import NodeState
from shared.handling import Outcome, run_handler
from tests.harness import ManualClock, healthy, xid

ROUTES = control_plane_routes()

pytestmark = pytest.mark.integration

NODE = "c1-gpu-001"
SETTINGS = ps.DeliverySettings(
    ack_deadline_s=10, max_delivery_attempts=5, min_backoff_s=0.1, max_backoff_s=0.5
)


@dataclass
class Gcp:
    store: FirestoreDocStore
    plane: StorePlane
    runtime: GcpRuntime
    compute: SafeCompute
    clock: ManualClock
    prefix: str
    taps: list[str]
    outcomes: list[tuple[str, str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(
        self, event: Event | None = None, source: str = "//test/agent", *,
        envelope: Envelope | None = None
    ) -> Envelope:
        """Publish an event, or an envelope again (a duplicate: the same source + id)."""
        if envelope is None:
            assert event is not None
            envelope = make_envelope(event, source, self.clock.now())
        self.runtime.publisher.publish(envelope)
        return envelope

    def report(self, conditions: Any, observed_at: float | None = None) -> Envelope:
        at = self.clock.now() if observed_at is None else observed_at
        return self.publish(NodeHealthReported(node_id=NODE, observed_at=at, conditions=conditions))

    def outcomes_of(self, service: str, env: Envelope) -> list[str]:
        with self.lock:
            return [o for s, i, _, o in self.outcomes if s == service and i == env.id]

    def tapped(self, event_type: str) -> list[Envelope]:
        """Every message of this type published so far (read once: pulls acknowledge)."""
        out = []
        family = event_type.split(".")[1]
        for path in [p for p in self.taps if p.endswith(f"-{family}")]:
            for message in ps.pull(path, timeout_s=2):
                attrs = dict(message.attributes)
                if attrs.get("ce-type") == event_type:
                    out.append(from_pubsub_message({"attributes": attrs, "data": message.data}))
        return out

    def node_state(self) -> NodeState:
        state: NodeState = self.plane.node(NODE).state
        return state


@pytest.fixture
def gcp(emulators: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Gcp]:
    reset_firestore()
    store = firestore_store()
    clock = ManualClock(time.time())
    compute = SafeCompute()
    plane = StorePlane(store, clock, compute)
    plane.up()
    prefix = f"t{uuid.uuid4().hex[:6]}-"
    runtime = GcpRuntime(
        GcpSettings(PROJECT, topic_prefix=prefix, compute="none"),
        store=store,
        compute=compute,
        clock=clock,
        config=plane.deps.config,
    )
    rt_mod.install(runtime)
    server = Server(
        DispatcherMiddleware(not_found, {f"/{s}": function_app(s) for s in SERVICES})
    )
    plans = ps.ensure_topology(
        PROJECT, {s: f"{server.url}/{s}/" for s in SERVICES}, ROUTES, settings=SETTINGS,
        prefix=prefix
    )
    taps = ps.tap(PROJECT, "test", ROUTES, prefix=prefix)
    g = Gcp(store, plane, runtime, compute, clock, prefix, taps)

    real = run_handler

    def spy(service: str, handler: Any, envelope: Envelope, deps: Any) -> Outcome:
        try:
            outcome = real(service, handler, envelope, deps)
        except Exception as exc:
            with g.lock:
                g.outcomes.append((service, envelope.id, envelope.type, f"raised {exc}"))
            raise
        with g.lock:
            g.outcomes.append((service, envelope.id, envelope.type, outcome.value))
        return outcome

    monkeypatch.setattr("services.wiring.runtime.run_handler", spy)
    try:
        yield g
    finally:
        sub = ps.subscriber_client()
        for path in [sub.subscription_path(PROJECT, p.name) for p in plans] + taps:
            sub.delete_subscription(request={"subscription": path})
        server.close()
        rt_mod.install(None)


def not_found(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 Not Found", [])
    return [b""]


def settle(seconds: float = 1.0) -> None:
    """Give stray redeliveries a chance to show up before asserting they did not happen."""
    time.sleep(seconds)


def test_duplicate_delivery_is_applied_once(gcp: Gcp) -> None:
    env = gcp.report(xid(79, gcp.clock.now()))
    gcp.publish(envelope=env)  # the same CloudEvent (source + id) again
    wait_for(
        lambda: {"handled", "duplicate"} <= set(gcp.outcomes_of("health_triage", env)), what="both deliveries"
    )
    wait_for(lambda: gcp.node_state() is NodeState.REPAIRING, what="repair")
    settle()
    outcomes = gcp.outcomes_of("health_triage", env)
    # The two copies may arrive at once: then one loses the transaction (Contention, 500)
    # and its redelivery finds the idempotency record.
    assert outcomes.count("handled") == 1
    assert all(o in ("handled", "duplicate") or "concurrent transaction" in o for o in outcomes), outcomes
    assert gcp.compute.repairs == [(NODE, RepairAction.REBOOT, 1)]
    assert len(gcp.tapped("mtc.node.diagnosed.v1")) == 1


def test_redelivery_after_a_handler_raised(gcp: Gcp) -> None:
    failures = iter([True])
    gcp.compute.fail["start_repair"] = lambda node: next(failures, False)
    gcp.report(xid(79, gcp.clock.now()))
    wait_for(lambda: gcp.node_state() is NodeState.REPAIRING, what="repair after a retry")
    settle()
    [diagnosed] = gcp.tapped("mtc.node.diagnosed.v1")
    outcomes = gcp.outcomes_of("repair", diagnosed)
    assert outcomes[0].startswith("raised injected failure") and outcomes[1:] == ["handled"]
    assert gcp.compute.repairs == [(NODE, RepairAction.REBOOT, 1)]
    assert gcp.plane.node(NODE).repair_attempt == 1  # the failed attempt left nothing behind


def test_out_of_order_reports_keep_the_newest(gcp: Gcp) -> None:
    t = gcp.clock.now()
    newer = gcp.report(healthy(t + 10), observed_at=t + 10)
    wait_for(lambda: gcp.outcomes_of("health_triage", newer) == ["handled"], what="newer")
    older = gcp.report(xid(79, t + 5), observed_at=t + 5)  # delivered late
    wait_for(lambda: gcp.outcomes_of("health_triage", older) == ["handled"], what="older")
    settle()
    node = gcp.plane.node(NODE)
    assert node.state is NodeState.IDLE and node.last_report_at == t + 10
    assert gcp.compute.repairs == []
    assert gcp.tapped("mtc.node.diagnosed.v1") == []


def test_poison_event_ends_in_the_dead_letter_topic(gcp: Gcp) -> None:
    gcp.compute.fail["start_repair"] = lambda node: True  # fails on every delivery
    gcp.report(xid(79, gcp.clock.now()))
    dead = ps.dead_letter_subscription_id(gcp.prefix)
    path = f"projects/{PROJECT}/subscriptions/{dead}"
    forwarded: list[Any] = []

    def arrived() -> bool:
        forwarded.extend(
            m for m in ps.pull(path, timeout_s=2) if m.attributes.get("ce-type") == "mtc.node.diagnosed.v1"
        )
        return bool(forwarded)

    wait_for(arrived, timeout_s=60, what="the poison event in the dead-letter topic")
    [message] = forwarded
    env = from_pubsub_message({"attributes": dict(message.attributes), "data": message.data})
    attempts = gcp.outcomes_of("repair", env)
    assert len(attempts) == SETTINGS.max_delivery_attempts
    assert all(a.startswith("raised") for a in attempts)
    assert gcp.node_state() is NodeState.IDLE  # no partial effect of the failed attempts


def test_malformed_event_is_dead_lettered_at_once(gcp: Gcp) -> None:
    publisher = gcp.runtime.publisher
    topic = publisher.topic_path(ps.topic_id("node", gcp.prefix))
    publisher.client.publish(
        topic,
        b'{"observed_at": "yesterday"}',
        **{
            "ce-specversion": "1.0",
            "ce-id": "bad-1",
            "ce-source": "//test/agent",
            "ce-type": "mtc.node.health_reported.v1",
            "ce-time": "2030-01-01T00:00:00Z",
        },
    ).result()
    path = f"projects/{PROJECT}/subscriptions/{ps.dead_letter_subscription_id(gcp.prefix)}"
    messages: list[Any] = []

    def arrived() -> bool:
        messages.extend(ps.pull(path, timeout_s=2))
        return any(m.attributes.get("mtc-service") == "health_triage" for m in messages)

    wait_for(arrived, what="the malformed event in the dead-letter topic")
    letter = next(m for m in messages if m.attributes.get("mtc-service") == "health_triage")
    assert "node_id" in letter.attributes["mtc-reason"]
    records = [d for d in gcp.store.read("dead_letters", {}) if d["service"] == "health_triage"]
    assert records and "node_id" in records[0]["reason"]
    assert gcp.compute.repairs == []


class Crash(Exception):
    pass


class CrashingPublisher:
    def publish(self, envelope: Envelope) -> None:
        raise Crash("process killed between commit and publish")


def test_crash_between_commit_and_publish_is_recovered_by_the_sweeper(gcp: Gcp) -> None:
    env = make_envelope(
        NodeHealthReported(node_id=NODE, observed_at=gcp.clock.now(), conditions=xid(79, gcp.clock.now())),
        "//test/agent",
        gcp.clock.now(),
    )
    crashing = dataclasses.replace(gcp.runtime.deps, publisher=CrashingPublisher())
    with pytest.raises(Crash):
        run_handler("health_triage", on_health_reported, env, crashing)
    [left] = gcp.store.read(OUTBOX, {})
    assert left["type"] == "mtc.node.diagnosed.v1"
    assert gcp.node_state() is NodeState.IDLE  # nobody heard of the diagnosis yet

    # Pub/Sub redelivers the report (the function answered 500): it was committed, so it is
    # a duplicate and emits nothing new.
    gcp.publish(envelope=env)
    wait_for(lambda: gcp.outcomes_of("health_triage", env) == ["duplicate"], what="redelivery")

    assert outbox.sweep_outbox(gcp.store, gcp.runtime.publisher, now=gcp.clock.now() + 60) == 1
    assert gcp.store.read(OUTBOX, {}) == []
    wait_for(lambda: gcp.node_state() is NodeState.REPAIRING, what="repair from the sweep")
    # the handlers the sweep woke publish their own entries and remove them; a sweep while
    # one is between its commit and its publish would (rightly) find it, so wait them out
    wait_for(lambda: gcp.store.read(OUTBOX, {}) == [], what="the handlers' own publishes")
    assert outbox.sweep_outbox(gcp.store, gcp.runtime.publisher, now=gcp.clock.now() + 60) == 0
    settle()
    assert gcp.compute.repairs == [(NODE, RepairAction.REBOOT, 1)]


def test_sweepers_racing_publish_each_entry_once(gcp: Gcp) -> None:
    for i in range(3):
        outbox.leave_in_outbox(
            gcp.store,
            make_envelope(
                NodeHealthReported(
                    node_id=NODE, observed_at=gcp.clock.now() + i, conditions=healthy(gcp.clock.now() + i)
                ),
                "//test/agent",
                gcp.clock.now(),
            ),
        )
    published: list[str] = []

    class Recorder:
        def publish(self, envelope: Envelope) -> None:
            published.append(envelope.id)

    now = gcp.clock.now() + 60
    threads = [
        threading.Thread(target=outbox.sweep_outbox, args=(gcp.store, Recorder()), kwargs={"now": now})
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(published) == len(set(published)) == 3
    assert gcp.store.read(OUTBOX, {}) == []


def test_concurrent_handlers_on_one_node_one_wins_the_other_retries(gcp: Gcp) -> None:
    """Two reports for one node handled at the same time: both read the node, both try to
    commit; Firestore lets one transaction win, the other fails with Contention (the
    function answers 500 and Pub/Sub redelivers; here the test redelivers). The retry runs
    on the winner's state."""
    t = gcp.clock.now()
    envs = [
        make_envelope(
            NodeHealthReported(node_id=NODE, observed_at=t + dt, conditions=healthy(t + dt)),
            "//test/agent",
            t,
        )
        for dt in (1, 2)
    ]
    barrier = threading.Barrier(2, timeout=20)
    first_attempt = {e.id: True for e in envs}
    results: dict[str, list[str]] = {e.id: [] for e in envs}
    seen_before: dict[str, float | None] = {}
    committed: list[str] = []  # envelope ids in the order their transactions committed
    lock = threading.Lock()

    def handler(event: NodeHealthReported, uow: Any, deps: Any) -> None:
        env_id = next(e.id for e in envs if e.event == event)
        seen_before[env_id] = uow.nodes.get(NODE).last_report_at
        on_health_reported(event, uow, deps)
        if first_attempt[env_id]:
            first_attempt[env_id] = False
            barrier.wait()  # both have read the node: now both commit

    def deliver(env: Envelope) -> None:
        for _ in range(6):  # what Pub/Sub redelivery does, with its backoff
            try:
                outcome = run_handler("health_triage", handler, env, gcp.runtime.deps).value
            except Contention:
                results[env.id].append("contention")
                time.sleep(random.uniform(0.05, 0.5))
                continue
            with lock:
                committed.append(env.id)
            results[env.id].append(outcome)
            return

    threads = [threading.Thread(target=deliver, args=(e,)) for e in envs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=90)
    # Each report is applied exactly once; at least one transaction lost. (The emulator may
    # abort both of two deadlocked transactions; Firestore itself lets the older one win.)
    assert all(r and r[-1] == "handled" and r.count("handled") == 1 for r in results.values()), \
        results
    assert sum(r.count("contention") for r in results.values()) >= 1, results
    first, last = (next(e for e in envs if e.id == i) for i in committed)
    first_report = first.event
    assert isinstance(first_report, NodeHealthReported)
    assert seen_before[last.id] == first_report.observed_at  # the retry saw the new state
    node = gcp.plane.node(NODE)
    assert node.last_report_at == t + 2 and node.state is NodeState.IDLE
    keys = {d["key"] for d in gcp.store.read(PROCESSED, {})}
    assert {f"health_triage:{e.key}" for e in envs} <= keys


def test_burst_of_reports_for_one_node_each_applied_once(gcp: Gcp) -> None:
    """The same story through Pub/Sub: a burst of reports for one node, pushed to the
    threaded function server at once (a loser answers 500 and is redelivered); every
    report ends handled exactly once and the newest wins."""
    t = gcp.clock.now()
    envs = [gcp.report(healthy(t + i), observed_at=t + i) for i in range(1, 5)]
    wait_for(
        lambda: all(
            "handled" in gcp.outcomes_of("health_triage", e)
            or "duplicate" in gcp.outcomes_of("health_triage", e)
            for e in envs
        ),
        timeout_s=60,
        what="every report handled",
    )
    settle()
    for env in envs:
        assert gcp.outcomes_of("health_triage", env).count("handled") == 1
    assert gcp.plane.node(NODE).last_report_at == t + 4
