"""Alerts: the pure rules and their deduplication, and the acceptance story on the real
handlers: a held repair ticked over and over is delivered once, then once more after the
reminder interval, then once more when it resolves."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.observability import alerts
from services.observability.alert_sinks import WebhookSink, payload, webhook_from_env
from shared.config import ControlPlaneConfig
from shared.domain.events import AlertRaised, FleetTicked
from shared.domain.model import NodeState
from tests.harness import Plane, healthy, xid

REMINDER_S = 600.0
TICK_S = 5.0


def ready_plane() -> tuple[Plane, list[AlertRaised]]:
    """Heartbeats never time out here: the ticks must not add faults of their own."""
    config = ControlPlaneConfig(alert_reminder_s=REMINDER_S, heartbeat_timeout_s=1e9)
    plane = Plane(config)
    sent: list[AlertRaised] = []
    plane.bus.listeners.append(
        lambda env, _: sent.append(env.event) if isinstance(env.event, AlertRaised) else None)
    plane.up()
    return plane, sent


def held_plane() -> tuple[Plane, list[AlertRaised]]:
    """4 workers (25 %: one may be out), two XID 79s: the second node's repair is held."""
    plane, sent = ready_plane()
    plane.report("c1-gpu-000", xid(79, plane.clock.now()))
    plane.report("c1-gpu-001", xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node("c1-gpu-001").state is NodeState.SUSPECT
    return plane, sent


def tick(plane: Plane, times: int) -> None:
    for _ in range(times):
        plane.clock.advance(TICK_S)
        plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()), "//mtc/scheduler")
        plane.deliver()


def test_a_held_repair_alerts_once_then_on_reminder_then_on_resolution() -> None:
    plane, sent = held_plane()
    tick(plane, 100)  # 500 s of ticks, under the reminder interval
    held = [a for a in sent if a.kind == "repair_held"]
    assert [(a.target, a.state, a.sent) for a in held] == [("c1-gpu-001", "firing", 1)]
    assert held[0].severity == "WARNING" and "repair held" in held[0].summary
    tick(plane, 25)  # past 600 s since it was sent: one reminder, and only one
    held = [a for a in sent if a.kind == "repair_held"]
    assert [(a.state, a.sent) for a in held] == [("firing", 1), ("firing", 2)]
    tick(plane, 20)
    assert len([a for a in sent if a.kind == "repair_held"]) == 2
    plane.report("c1-gpu-001", healthy(plane.clock.now()))  # healthy again: hold released
    plane.deliver()
    assert plane.node("c1-gpu-001").state is NodeState.ALLOCATED or \
        plane.node("c1-gpu-001").state is NodeState.IDLE
    tick(plane, 50)
    held = [a for a in sent if a.kind == "repair_held"]
    assert [(a.state, a.sent) for a in held] == [("firing", 1), ("firing", 2), ("resolved", 3)]
    with plane.uow() as uow:
        docs = uow.records(alerts.ALERTS, {})
    assert [(d["kind"], d["state"]) for d in docs if d["kind"] == "repair_held"] == [
        ("repair_held", "resolved")]


def test_a_tick_that_changes_nothing_writes_no_alert_and_stays_out_of_the_timeline() -> None:
    plane, sent = held_plane()
    tick(plane, 1)
    before = len(list(plane.deps.event_log.read()))  # type: ignore[union-attr]
    tick(plane, 10)
    assert len(list(plane.deps.event_log.read())) == before  # type: ignore[union-attr]
    assert len([a for a in sent if a.kind == "repair_held"]) == 1
    with plane.uow() as uow:
        ticks = uow.records(alerts.CONTROLLER_TICKS, {})
    assert [t["at"] for t in ticks] == [plane.clock.now()]


def test_a_failed_node_alerts_once_per_reminder() -> None:
    plane, sent = ready_plane()
    plane.report("c1-gpu-002", xid(54, plane.clock.now()))  # MANUAL: drained, then FAILED
    plane.deliver()
    assert plane.node("c1-gpu-002").state is NodeState.FAILED
    tick(plane, 3)
    failed = [a for a in sent if a.kind == "node_failed"]
    assert [(a.target, a.severity, a.node_id) for a in failed] == [
        ("c1-gpu-002", "ERROR", "c1-gpu-002")]
    tick(plane, int(REMINDER_S / TICK_S) + 1)
    assert [a.sent for a in sent if a.kind == "node_failed"] == [1, 2]


def alert(summary: str = "s", kind: str = "repair_held") -> alerts.Alert:
    return alerts.Alert(kind, "n1", summary, cluster_id="c1", node_id="n1")


def stored(plan: alerts.Plan) -> list[dict[str, Any]]:
    return [{**doc, "_id": doc_id} for doc_id, doc in plan.writes.items()]


def test_reconcile_dedups_by_kind_and_subject() -> None:
    kinds = alerts.cluster_kinds()
    first = alerts.reconcile([alert()], [], 100.0, reminder_s=60, retention_s=10, kinds=kinds)
    assert len(first.sends) == 1 and first.sends[0]["first_at"] == 100.0
    again = alerts.reconcile([alert()], stored(first), 130.0, reminder_s=60, retention_s=10,
                             kinds=kinds)
    assert again.sends == [] and again.writes == {}
    changed = alerts.reconcile([alert("other")], stored(first), 130.0, reminder_s=60,
                               retention_s=10, kinds=kinds)
    assert [(d["summary"], d["sent"], d["first_at"]) for d in changed.sends] == [
        ("other", 2, 100.0)]
    reminded = alerts.reconcile([alert()], stored(first), 160.0, reminder_s=60,
                                retention_s=10, kinds=kinds)
    assert [d["sent"] for d in reminded.sends] == [2]
    resolved = alerts.reconcile([], stored(first), 170.0, reminder_s=60, retention_s=10,
                                kinds=kinds)
    assert [(d["state"], d["resolved_at"]) for d in resolved.sends] == [("resolved", 170.0)]
    quiet = alerts.reconcile([], stored(resolved), 175.0, reminder_s=60, retention_s=10,
                             kinds=kinds)
    assert quiet.sends == [] and quiet.deletes == []
    gone = alerts.reconcile([], stored(resolved), 181.0, reminder_s=60, retention_s=10,
                            kinds=kinds)
    assert gone.deletes == list(resolved.writes)
    other_scope = alerts.reconcile([], stored(first), 170.0, reminder_s=60, retention_s=10,
                                   kinds=alerts.global_kinds())
    assert other_scope.sends == [] and other_scope.writes == {}


def test_a_lemon_is_not_reminded_and_the_controller_alert_is_read_live() -> None:
    kinds = alerts.cluster_kinds()
    first = alerts.reconcile([alert(kind="lemon")], [], 0.0, reminder_s=60, retention_s=10,
                             kinds=kinds)
    later = alerts.reconcile([alert(kind="lemon")], stored(first), 1e6, reminder_s=60,
                             retention_s=10, kinds=kinds)
    assert later.sends == []
    assert alerts.controller_alert(None, 1000.0) is None
    assert alerts.controller_alert(990.0, 1000.0) is None
    late = alerts.controller_alert(100.0, 1000.0, stale_s=180.0)
    assert late is not None and late.kind == "controller_unreachable"
    listed = alerts.listing(stored(first), 1000.0, 100.0)
    assert [d["kind"] for d in listed] == ["controller_unreachable", "lemon"]
    assert alerts.dead_letter_alert(0) is None
    dead = alerts.dead_letter_alert(3)
    assert dead is not None and dead.details == {"count": 3}


# ---------------------------------------------------------------- the webhook


class _Hook(http.server.BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]]
    fail_first: list[int]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.fail_first and self.fail_first[0] > 0:
            self.fail_first[0] -= 1
            self.send_response(503)
        else:
            self.bodies.append(body)
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]], list[int]]]:
    bodies: list[dict[str, Any]] = []
    fail_first = [0]
    handler = type("Hook", (_Hook,), {"bodies": bodies, "fail_first": fail_first})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)  # quick shutdown
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", bodies, fail_first
    finally:
        server.shutdown()
        server.server_close()


def test_the_webhook_gets_one_post_per_delivered_alert_with_retries(
        hook: tuple[str, list[dict[str, Any]], list[int]]) -> None:
    url, bodies, fail_first = hook
    fail_first[0] = 1  # the first try answers 503: retried
    plane, _ = held_plane()
    sink = WebhookSink(url, backoff_s=0.01)
    plane.bus.listeners.append(sink)
    tick(plane, 40)
    assert sink.flush(5.0)
    held = [b for b in bodies if b["kind"] == "repair_held"]
    assert [(b["target"], b["state"], b["type"]) for b in held] == [
        ("c1-gpu-001", "firing", "mtc.alerts.raised.v1")]
    assert sink.delivered == 1 and sink.failed == 0


def test_a_dead_webhook_never_blocks_the_caller() -> None:
    calls: list[float] = []

    def refuse(url: str, body: Any, timeout_s: float) -> int:
        calls.append(timeout_s)
        raise OSError("connection refused")

    sink = WebhookSink("http://127.0.0.1:9/x", tries=3, backoff_s=0.01, post=refuse)
    plane, _ = held_plane()
    tick(plane, 1)
    env = next(e for e in plane.delivered if isinstance(e.event, AlertRaised))
    started = time.monotonic()
    sink(env)  # returns at once: the thread does the trying
    assert time.monotonic() - started < 0.5
    assert sink.flush(5.0)
    assert calls == [2.0, 2.0, 2.0] and sink.failed == 1
    assert payload(env)["target"] == "c1-gpu-001"


def test_the_webhook_comes_from_the_environment() -> None:
    assert webhook_from_env({}) is None
    sink = webhook_from_env({"MTC_ALERT_WEBHOOK": "http://127.0.0.1:1/a"})
    assert sink is not None and webhook_from_env({"MTC_ALERT_WEBHOOK": "http://127.0.0.1:1/a"}) is sink
    with pytest.raises(ValueError, match="MTC_ALERT_WEBHOOK"):
        WebhookSink("ftp://x")
