"""`mtc serve`: the Vertex AI API and the embedded control plane, in one process.

Two sides that never wait on each other (docs/server.md): waitress answers requests on a
few threads, reading and buffering each request whole before a thread sees it, so a client
that stalls holds only its socket; the control loop (``services.wiring.control_loop``) delivers
the bus, ticks the fleet and prunes on a thread of its own. Nothing heals unless this (or
`mtc controller`) runs; with it, a GET after a change shows its effects (the call that
changed something waits a bounded moment for the loop to deliver what it committed; a GET
never waits for the loop).
"""

from __future__ import annotations

import gc
import ipaddress
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from waitress import wasyncore
from waitress.server import create_server

from services.api.health import HealthEndpoints
from services.api.http import create_app
from services.console.app import register as register_console
from services.console.history import History, Sampler
from services.observability.http import Observability
from services.observability.http import add_routes as add_observability
from services.wiring.api import embedded_api
from services.wiring.control_loop import ControlLoop, LoopRuntime, readiness
from services.wiring.embedded import EmbeddedApp, embedded
from shared import logs

THREADS = 8  # request threads; the control loop has its own
CHANNEL_TIMEOUT_S = 30  # an idle or stalled connection is closed after this long
CONNECTION_LIMIT = 200  # open connections; past it, new ones wait in the listen backlog
POLL_S = 0.5  # the socket loop looks at the stop signal this often
PRUNE_S = 600.0
GC_YOUNG = 10_000  # allocations between collections of the youngest generation (Python: 700)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def serve(state_dir: Path, *, host: str = "127.0.0.1", port: int = 8080,
          app: EmbeddedApp | None = None, env_token: str | None = None,
          duration_s: float | None = None, out: Callable[[str], None] = print,
          sim_dir: Path | None = None, threads: int = THREADS, pump_s: float = 0.1,
          tick_s: float = 5.0) -> int:
    """``pump_s``/``tick_s``: the control loop's cadence (the chaos soak runs it faster)."""
    logs.setup()  # mtc.* loggers: JSON lines off a terminal
    app = app or embedded(state_dir, verify=True)  # a damaged state is refused, named
    loop = ControlLoop(app, pump_s=pump_s, tick_s=tick_s)
    ctx, auth = embedded_api(app, env_token, runtime=LoopRuntime(loop))
    ctx.wait_slots = threading.BoundedSemaphore(max(1, threads // 2))  # half for :wait at most
    if ctx.audit is not None:
        audit, clock = ctx.audit, app.deps.clock
        loop.chores = (lambda: audit.prune(clock.now()),)
        loop.chore_s = PRUNE_S
    history = History(app.store)  # the console's charts, sampled on a thread of their own
    sampler = Sampler(history, app.deps.uow, app.deps.event_log, app.deps.clock)
    flask_app = create_app(ctx)
    register_console(flask_app, ctx, sim_dir, history)
    # /metrics and /alerts.json: open on loopback, a viewer token otherwise
    add_observability(flask_app, Observability(app.store, app.deps.clock, ctx.guard,
                                               open_access=is_loopback(host),
                                               event_log=app.deps.event_log))
    wsgi = HealthEndpoints(flask_app, readiness(app, loop))
    sockets: dict[int, Any] = {}
    server = create_server(wsgi, map=sockets, host=host, port=port, threads=threads,
                           channel_timeout=CHANNEL_TIMEOUT_S, connection_limit=CONNECTION_LIMIT,
                           asyncore_use_poll=True, ident="mtc")
    url = f"http://{host}:{_port(server, port)}"
    out(f"mtc API on {url}  (state: {app.state_dir})")
    out(f"console: {url}/console" + (f"  (twin results: {sim_dir})" if sim_dir else ""))
    out(f"probes: {url}/healthz {url}/readyz  (no token)")
    if auth.admin_token_file is not None:
        out(f"admin token: {auth.admin_token_file}  "
            f"(curl -H \"Authorization: Bearer $(cat {auth.admin_token_file})\" ...)")
    else:
        out("admin token: the MTC_API_TOKEN you set")
    if not is_loopback(host):
        out(f"warning: listening on {host}, reachable from the network; every call still "
            "needs a token")
    sys.stdout.flush()
    steady_collector()
    stopping = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    deadline = time.monotonic() + duration_s if duration_s else float("inf")
    loop.start()
    sampler.start()
    try:
        while not stopping.is_set() and time.monotonic() < deadline:
            wasyncore.loop(timeout=POLL_S, map=sockets, use_poll=True, count=1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.task_dispatcher.shutdown()  # requests under way get a few seconds
        wasyncore.close_all(sockets)
        sampler.stop()
        loop.stop()  # the pass under way ends before the store closes
        wsgi.close()
        app.close()
    out("mtc serve stopped")
    sys.stdout.flush()
    return 0


def steady_collector(young: int = GC_YOUNG) -> None:
    """What the server made to start (modules, schemas, the app: some 100,000 objects that
    live as long as it does) leaves the garbage collector's sight, and young objects are
    collected less often: a request makes thousands, and full collections that walked
    everything took up to a few hundred ms at a time, all threads stopped, under load."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(young, *gc.get_threshold()[1:])


def _port(server: Any, asked: int) -> int:
    """The port bound (``--port 0``: the one the system chose)."""
    port = getattr(server, "effective_port", None)
    if port is None:  # a name that resolves to several addresses: one socket each
        listen = getattr(server, "effective_listen", None) or [(None, asked)]
        port = listen[0][1]
    return int(port)
