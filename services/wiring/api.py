"""The API's composition: the control plane it commands, who may call it, where calls are
audited. ``mtc serve`` and the functions-framework ``api`` target both build it here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from services.api.audit import AuditLog
from services.api.context import ApiContext
from services.api.security import LocalAuth, google_auth, local_auth
from services.wiring.embedded import EmbeddedApp
from shared.handling import Deps, Runtime
from shared.ports import DocStore


@dataclass
class EmbeddedApiRuntime:
    """The embedded app seen from the API: after a call (and before a read) deliver what is
    queued, in a bounded slice so a request never waits on a large fleet's backlog."""

    app: EmbeddedApp
    budget_s: float = 0.5
    deps: Deps = field(init=False)
    store: DocStore = field(init=False)

    def __post_init__(self) -> None:
        self.deps = self.app.deps
        self.store = self.app.store

    def after_request(self) -> None:
        self.app.pump(budget_s=self.budget_s, max_polls=1)


def embedded_api(app: EmbeddedApp, env_token: str | None = None) -> tuple[ApiContext, LocalAuth]:
    auth = local_auth(app.state_dir, env_token if env_token is not None
                      else os.environ.get("MTC_API_TOKEN") or None)
    audit = AuditLog(app.store, app.deps.config.retention_s)
    return ApiContext(EmbeddedApiRuntime(app), auth.guard, audit), auth


def cloud_api(runtime: Runtime, store: DocStore) -> ApiContext:
    """Google Cloud: Google ID tokens (audience ``MTC_API_AUDIENCE``) mapped to roles by the
    policy in the store; ``MTC_API_TOKEN``, when set, is an admin token besides."""
    guard = google_auth(store, os.environ.get("MTC_API_AUDIENCE") or None,
                        os.environ.get("MTC_API_TOKEN") or None)
    return ApiContext(runtime, guard, AuditLog(store, runtime.deps.config.retention_s))
