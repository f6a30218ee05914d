"""`mtc serve`: the Vertex AI API and the embedded control plane, in one process.

One thread does both, in turns: answer a request (or wait up to 0.1 s for one), deliver
what the bus has queued, tick the fleet every few seconds. Nothing heals unless this (or
`mtc controller`) runs; with it, a GET always shows current state.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from werkzeug.serving import make_server

from services.api.http import create_app
from services.console.app import register as register_console
from services.observability.http import Observability
from services.observability.http import add_routes as add_observability
from services.wiring.api import embedded_api
from services.wiring.embedded import EmbeddedApp, embedded
from shared import logs

PUMP_S = 0.1  # at most this long between two deliveries of the bus (the tick: wiring.api)
PRUNE_S = 600.0


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def serve(state_dir: Path, *, host: str = "127.0.0.1", port: int = 8080,
          app: EmbeddedApp | None = None, env_token: str | None = None,
          duration_s: float | None = None, out: Callable[[str], None] = print,
          sim_dir: Path | None = None) -> int:
    logs.setup()  # mtc.* loggers: JSON lines off a terminal
    app = app or embedded(state_dir)
    ctx, auth = embedded_api(app, env_token)
    flask_app = create_app(ctx)
    register_console(flask_app, ctx, sim_dir)
    # /metrics and /alerts.json: open on loopback, a viewer token otherwise
    add_observability(flask_app, Observability(app.store, app.deps.clock, ctx.guard,
                                               open_access=is_loopback(host),
                                               event_log=app.deps.event_log))
    server = make_server(host, port, flask_app, threaded=False)
    server.timeout = PUMP_S
    url = f"http://{host}:{server.server_port}"
    out(f"mtc API on {url}  (state: {app.state_dir})")
    out(f"console: {url}/console" + (f"  (twin results: {sim_dir})" if sim_dir else ""))
    if auth.admin_token_file is not None:
        out(f"admin token: {auth.admin_token_file}  "
            f"(curl -H \"Authorization: Bearer $(cat {auth.admin_token_file})\" ...)")
    else:
        out("admin token: the MTC_API_TOKEN you set")
    if not is_loopback(host):
        out(f"warning: listening on {host}, reachable from the network; every call still "
            "needs a token")
    stopping: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    deadline = time.monotonic() + duration_s if duration_s else float("inf")
    next_prune = time.monotonic()
    try:
        while not stopping and time.monotonic() < deadline:
            server.handle_request()
            ctx.runtime.after_request()  # deliver a slice, tick the fleet when due
            now = time.monotonic()
            if now >= next_prune:
                if ctx.audit is not None:
                    ctx.audit.prune(app.deps.clock.now())
                next_prune = now + PRUNE_S
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.server_close()
        app.close()
    out("mtc serve stopped")
    sys.stdout.flush()
    return 0
