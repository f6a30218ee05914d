"""`mtc serve`: the Vertex AI API and the embedded control plane, in one process.

Two sides that never wait on each other (docs/server.md): waitress answers requests on a
few threads, reading and buffering each request whole before a thread sees it, so a client
that stalls holds only its socket, and that not for long (``services.cli.connections``: a
deadline on each request, a share of the connections per client); the control loop
(``services.wiring.control_loop``) delivers the bus, ticks the fleet and prunes on a thread
of its own. Nothing heals unless this (or `mtc controller`) runs; with it, a GET after a
change shows its effects (the call that changed something waits a bounded moment for the
loop to deliver what it committed; a GET never waits for the loop).
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

from services.api import autoscaler
from services.api.context import ApiContext
from services.api.health import HealthEndpoints
from services.api.http import create_app
from services.api.serving_metrics import ServingCollector
from services.cli.connections import PER_CLIENT, ConnectionGuard, Limits
from services.console.app import register as register_console
from services.console.history import History, Sampler
from services.observability.http import Observability
from services.observability.http import add_routes as add_observability
from services.wiring.api import embedded_api
from services.wiring.control_loop import ControlLoop, LoopRuntime, readiness
from services.wiring.embedded import EmbeddedApp, embedded
from services.wiring.job_credentials import ENDPOINT_FILE
from shared import logs
from shared.adapters.compute.local import volume

THREADS = 8  # request threads; the control loop has its own
CHANNEL_TIMEOUT_S = 30  # an idle connection is closed after this long
# open connections; past it, a new one takes the place of the one that has waited longest
# with nothing asked (services.cli.connections), or waits in the listen backlog
CONNECTION_LIMIT = 200
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
          tick_s: float = 5.0, per_client: int | None = None, jobs_volume: bool = False
          ) -> int:
    """``pump_s``/``tick_s``: the control loop's cadence (the chaos soak runs it faster);
    ``per_client``: waiting connections one address may hold (None: ``PER_CLIENT``,
    services.cli.connections); ``jobs_volume``: job outputs on a file system of their own
    (``volume``: as root, where the state's outputs are in ``<state>/jobs``)."""
    logs.setup()  # mtc.* loggers: JSON lines off a terminal
    if jobs_volume and app is None:
        said = volume.ensure(Path(state_dir).resolve() / "jobs")
        out(f"job outputs: {'on a file system of their own' if 'mounted' in said else said}")
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
    wsgi = application(app, ctx, loop, history, sim_dir)
    sockets: dict[int, Any] = {}
    server = create_server(wsgi, map=sockets, host=host, port=port, threads=threads,
                           channel_timeout=CHANNEL_TIMEOUT_S, connection_limit=CONNECTION_LIMIT,
                           asyncore_use_poll=True, ident="mtc")
    guard = ConnectionGuard(sockets, CONNECTION_LIMIT, Limits(per_client=per_client or PER_CLIENT))
    guard.install()
    url = f"http://{host}:{_port(server, port)}"
    # where jobs reach the API with their own credential (MTC_API)
    endpoint_file = app.state_dir / ENDPOINT_FILE
    endpoint_file.write_text(url + "\n")
    out(f"mtc API on {url}  (state: {app.state_dir})")
    out(f"console: {url}/console" + (f"  (twin results: {sim_dir})" if sim_dir else ""))
    out(f"probes: {url}/healthz {url}/readyz  (no token)")
    # the Google client libraries' switch to this server's Cloud Storage (services.api.storage)
    out(f"export STORAGE_EMULATOR_HOST={url}  # Cloud Storage (gs://) for the Google clients")
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
            guard.sweep()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.task_dispatcher.shutdown()  # requests under way get a few seconds
        wasyncore.close_all(sockets)
        sampler.stop()
        loop.stop()  # the pass under way ends before the store closes
        wsgi.close()
        app.close()
        endpoint_file.unlink(missing_ok=True)
    out("mtc serve stopped")
    sys.stdout.flush()
    return 0


def application(app: EmbeddedApp, ctx: ApiContext, loop: ControlLoop, history: History,
                sim_dir: Path | None) -> HealthEndpoints:
    """What `mtc serve` answers: the probes, then the API, the console, ``/metrics`` and
    ``/alerts.json``. The last two need a token on loopback too: jobs run on this host and
    share its network, so the address a call comes from says nothing about who makes it."""
    flask_app = create_app(ctx)
    register_console(flask_app, ctx, sim_dir, history)
    obs = Observability(app.store, app.deps.clock, ctx.guard, event_log=app.deps.event_log)
    obs.registry().register(ServingCollector(ctx))  # the endpoints' (this process routes)
    autoscaler.ensure(ctx)
    add_observability(flask_app, obs)
    return HealthEndpoints(flask_app, readiness(app, loop))


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
