"""The API's composition: the control plane it commands, who may call it, where calls are
audited. ``mtc serve`` and the functions-framework ``api`` target both build it here."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from services.api.audit import AuditLog
from services.api.context import ApiContext
from services.api.security import LocalAuth, google_auth, local_auth
from services.api.slurm_rest import SlurmRestConfig
from services.wiring.embedded import EmbeddedApp
from shared.handling import Deps, Runtime
from shared.ports import DocStore


@dataclass
class EmbeddedApiRuntime:
    """The embedded app seen from the API: after a call (and before a read) deliver what is
    queued, in a bounded slice so a request never waits on a large fleet's backlog."""

    app: EmbeddedApp
    budget_s: float = 0.5
    tick_s: float = 5.0  # the fleet tick (heartbeats, timeouts, backoff, watchdog)
    deps: Deps = field(init=False)
    store: DocStore = field(init=False)
    _next_tick: float = field(init=False, default=0.0)
    last_tick: float | None = field(init=False, default=None)  # monotonic; None: no tick yet

    def __post_init__(self) -> None:
        self.deps = self.app.deps
        self.store = self.app.store

    def after_request(self) -> None:
        """Deliver a bounded slice, and tick when one is due: a long ``:wait`` or a busy
        stream of requests must not stop the fleet's clock."""
        self.app.pump(budget_s=self.budget_s, max_polls=1)
        now = time.monotonic()
        if now >= self._next_tick:
            self.app.tick()
            self.last_tick = time.monotonic()
            self._next_tick = now + self.tick_s


def embedded_api(app: EmbeddedApp, env_token: str | None = None, *,
                 runtime: Runtime | None = None) -> tuple[ApiContext, LocalAuth]:
    """``runtime``: who delivers after a call; default, the call itself (in process, the CLI);
    ``mtc serve`` passes its control loop's (``control_loop.LoopRuntime``)."""
    # taken out of the environment: held in memory only, so no process this one starts
    # (a job's launcher, sbatch, a check) can inherit it
    from_env = os.environ.pop("MTC_API_TOKEN", None) or None
    auth = local_auth(app.state_dir, env_token if env_token is not None else from_env)
    audit = AuditLog(app.store, app.deps.config.retention_s)
    # a :wait holds one of the server's few request threads: it answers within 10 s, done
    # or not (AIP-151 lets a server return early); callers wait again
    ctx = ApiContext(runtime or EmbeddedApiRuntime(app), auth.guard, audit, max_wait_s=10.0,
                     storage_root=app.deps.config.output_root)
    slurm_conf = app.slurm_conf  # embedded over Slurm: its slurmrestd's tokens
    if slurm_conf and not os.environ.get("MTC_SLURM_CONF"):
        ctx.slurm_rest = SlurmRestConfig.from_env({**os.environ, "MTC_SLURM_CONF": slurm_conf})
    return ctx, auth


def cloud_api(runtime: Runtime, store: DocStore) -> ApiContext:
    """Google Cloud: Google ID tokens (audience ``MTC_API_AUDIENCE``) mapped to roles by the
    policy in the store; ``MTC_API_TOKEN``, when set, is an admin token besides."""
    guard = google_auth(store, os.environ.get("MTC_API_AUDIENCE") or None,
                        os.environ.get("MTC_API_TOKEN") or None)
    return ApiContext(runtime, guard, AuditLog(store, runtime.deps.config.retention_s))
