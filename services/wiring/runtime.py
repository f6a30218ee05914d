"""What every functions-framework entry point shares: lazy wiring and event dispatch.

Nothing is built at import time; the first request builds the app from the environment
(``MTC_BACKEND=embedded`` by default, ``gcp`` on Google Cloud or against the emulators).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

from cloudevents.http import CloudEvent

from services.wiring.routes import subscriptions
from shared import logs
from shared.adapters.event_log import DocEventLog, log_delivery
from shared.codec import decode
from shared.domain.errors import PermanentError
from shared.handling import Outcome, Runtime, run_handler

log = logging.getLogger("mtc.runtime")


class EmbeddedRuntime:
    def __init__(self, state_dir: Path) -> None:
        from services.wiring.embedded import embedded

        self.app = embedded(state_dir)
        self.deps = self.app.deps

    def after_request(self) -> None:
        self.app.pump()


_installed: list[Runtime] = []


def install(rt: Runtime | None) -> None:
    """Tests and tools hand the entry points a runtime of their own (None restores the default)."""
    _installed.clear()
    if rt is not None:
        _installed.append(rt)


def runtime() -> Runtime:
    return _installed[0] if _installed else _default_runtime()


@functools.cache
def _default_runtime() -> Runtime:
    logs.setup()  # the functions' runtime: JSON lines for Cloud Logging
    backend = os.environ.get("MTC_BACKEND", "embedded")
    if backend == "embedded":
        return EmbeddedRuntime(Path(os.environ.get("MTC_STATE_DIR", "var/mtc")))
    if backend == "gcp":
        from services.wiring.gcp import gcp_runtime

        return gcp_runtime()
    raise RuntimeError(f"MTC_BACKEND must be embedded or gcp, got {backend!r}")


_api_context: list[tuple[Runtime, Any]] = []


def api_context() -> Any:
    """The API's context over the current runtime, built once per runtime: embedded, local
    tokens in its state directory; Google Cloud, Google ID tokens and the stored policy."""
    rt = runtime()
    if not _api_context or _api_context[0][0] is not rt:
        from services.wiring.api import cloud_api, embedded_api

        ctx = embedded_api(rt.app)[0] if isinstance(rt, EmbeddedRuntime) else cloud_api(
            rt, rt.store)  # type: ignore[attr-defined]
        _api_context[:] = [(rt, ctx)]
    return _api_context[0][1]


def handle_cloud_event(service: str, event: CloudEvent, rt: Runtime | None = None) -> str:
    """Decode, run the service's handler, answer. Raising means 500: Pub/Sub redelivers.
    Every line logged meanwhile carries the CloudEvent's trace (its ``traceparent``)."""
    trace = logs.trace_field(logs.trace_id(extensions=event.get_attributes()))
    with logs.context(service=service, trace=trace):
        return _handle_cloud_event(service, event, rt)


def _handle_cloud_event(service: str, event: CloudEvent, rt: Runtime | None) -> str:
    rt = rt or runtime()
    try:
        envelope = decode(event)
    except PermanentError as exc:
        log.warning("%s: undecodable event dead-lettered: %s", service, exc)
        rt.deps.dead_letters.dead_letter(None, service, str(exc), raw=event.get_attributes())
        return Outcome.DEAD_LETTERED.value
    handler = subscriptions(service).get(envelope.type)
    if handler is None:
        return "ignored"  # a topic carries types other services care about
    outcome = run_handler(service, handler, envelope, rt.deps)
    if outcome is Outcome.HANDLED and isinstance(rt.deps.event_log, DocEventLog):
        log_delivery(rt.deps.event_log, envelope)  # no bus delivered it: it is logged here
    rt.after_request()
    return outcome.value


_observability: list[tuple[Runtime, Any]] = []


def observability() -> Any:
    """``/metrics`` and ``/alerts.json`` of the ``api`` function over the current runtime,
    behind a token (any role) as everywhere."""
    rt = runtime()
    if not _observability or _observability[0][0] is not rt:
        from services.observability.http import Observability

        store = rt.app.store if isinstance(rt, EmbeddedRuntime) else rt.store  # type: ignore[attr-defined]
        obs = Observability(store, rt.deps.clock, api_context().guard,
                            event_log=rt.deps.event_log)
        _observability[:] = [(rt, obs)]
    return _observability[0][1]


def handle_raw(service: str, body: Any, rt: Runtime | None = None) -> str:
    """For tests and tools: a structured-mode JSON body as a dict."""
    from cloudevents.http import from_dict

    return handle_cloud_event(service, from_dict(body), rt)
