"""`mtc serve`'s parts, in process: the probes in front of the API and the control loop on its
own thread (the whole server against stalled clients: tests/integration/test_serve_stalled.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client

from services.api.context import READING
from services.api.health import HealthEndpoints
from services.wiring.control_loop import ControlLoop, LoopRuntime, readiness
from services.wiring.embedded import embedded


def _api(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("401 Unauthorized", [("Content-Type", "text/plain")])
    return [b"token, please"]


def probes(**checks: Any) -> Client:
    return Client(HealthEndpoints(_api, checks, timeout_s=0.5))


def test_healthz_answers_without_a_token_and_the_rest_goes_to_the_api() -> None:
    client = probes(store=lambda: "down")
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json == {"status": "ok"}
    assert client.get("/v1beta1/projects/p/locations/l/customJobs").status_code == 401
    assert client.post("/readyz").status_code == 405


def test_readyz_names_the_check_that_failed() -> None:
    assert probes(store=lambda: None, controller=lambda: None).get("/readyz").json == {
        "status": "ok", "checks": {"store": "ok", "controller": "ok"}}
    resp = probes(store=lambda: None, controller=lambda: "no fleet tick yet").get("/readyz")
    assert resp.status_code == 503
    assert resp.json == {"status": "unavailable",
                         "checks": {"store": "ok", "controller": "no fleet tick yet"}}


def test_readyz_never_reports_unknown_as_ok() -> None:
    """A check that raises or does not answer in time is not ready, whatever it meant."""
    hang = threading.Event()

    def broken() -> str | None:
        raise OSError("disk gone")

    try:
        resp = probes(store=broken, controller=lambda: hang.wait(5) and None).get("/readyz")
    finally:
        hang.set()
    assert resp.status_code == 503
    assert resp.json["checks"]["store"] == "OSError: disk gone"
    assert resp.json["checks"]["controller"].startswith("no answer within")


class FakeApp:
    """What the loop drives: pump and tick, counted; a pump may be told to fail once."""

    def __init__(self) -> None:
        self.pumps = 0
        self.ticks = 0
        self.fail = False
        self.deps: Any = None
        self.store: Any = None

    def pump(self, *, budget_s: float, max_polls: int | None = None) -> int:
        self.pumps += 1
        if self.fail:
            self.fail = False
            raise RuntimeError("one bad pass")
        return 0

    def tick(self) -> None:
        self.ticks += 1


def test_the_loop_delivers_ticks_and_runs_chores_on_its_own_thread() -> None:
    app = FakeApp()
    chores: list[str] = []
    loop = ControlLoop(app, pump_s=30.0, tick_s=3600.0,  # type: ignore[arg-type]
                       chores=(lambda: chores.append(threading.current_thread().name),))
    assert not loop.settle(0.1)  # not started: a request does not wait for nothing
    loop.start()
    try:
        runtime = LoopRuntime(loop, settle_s=10.0)
        before = app.pumps
        runtime.after_request()  # a nudge: the loop passes now, not after pump_s (30 s)
        assert app.pumps > before
        assert app.ticks == 1 and chores == ["mtc-control-loop"]
        health = loop.health()
        assert health.alive and health.last_tick_age_s is not None
        app.fail = True  # a pass that raises is logged; the loop goes on
        assert loop.settle(10.0)
        assert loop.health().last_error == "RuntimeError: one bad pass"
        assert loop.settle(10.0) and loop.health().last_error is None
    finally:
        loop.stop()
    assert not loop.alive


def test_defect_10_a_read_never_waits_for_the_loops_pass() -> None:
    """A GET commits nothing: it answers while the loop is busy (its pass writes), where a
    call that changed something waits (boundedly) for the pass that delivers it."""
    app, busy = FakeApp(), threading.Event()
    pump = app.pump

    def slow_pump(**kw: Any) -> int:
        busy.wait(10)
        return pump(**kw)

    app.pump = slow_pump  # type: ignore[method-assign]
    loop = ControlLoop(app, pump_s=30.0, tick_s=3600.0).start()  # type: ignore[arg-type]
    runtime = LoopRuntime(loop, settle_s=0.3)
    try:
        reading = READING.set(True)
        try:
            t0 = time.monotonic()
            runtime.after_request()
            assert time.monotonic() - t0 < 0.1
        finally:
            READING.reset(reading)
        t0 = time.monotonic()
        runtime.after_request()  # a write's: waits for the pass, up to settle_s
        assert time.monotonic() - t0 >= 0.3
    finally:
        busy.set()
        loop.stop()


@pytest.fixture
def app(tmp_path: Path) -> Any:
    app = embedded(tmp_path)
    yield app
    app.close()


def test_readiness_needs_a_running_loop_that_ticked(app: Any) -> None:
    loop = ControlLoop(app, tick_s=3600.0)
    checks = readiness(app, loop, stale_s=60.0)
    assert checks["store"]() is None
    assert checks["controller"]() == "control loop not running"
    loop.start()
    try:
        assert loop.settle(10.0)
        assert checks["controller"]() is None
        stale = readiness(app, loop, stale_s=-1.0)["controller"]()
        assert stale is not None and stale.startswith("last fleet tick")
    finally:
        loop.stop()
    assert checks["controller"]() == "control loop not running"
