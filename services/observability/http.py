"""``GET /metrics`` (Prometheus text format) and ``GET /alerts.json`` (the alerts, for the
console), on ``mtc serve`` and on the Google Cloud ``api`` function.

Access: ``mtc serve`` bound to a loopback address answers both without a token (only this
machine can reach it). Anywhere else (``mtc serve --host 0.0.0.0``, the ``api`` function)
they need a bearer token of any role (viewer and up) on the project named by ``?project=``
(a token bound to every project, ``*``, when none is named); Prometheus sends one with
``authorization: {credentials_file: ...}`` in its scrape config.

``/alerts.json`` answers ``{"alerts": [...], "now": <unix time>}``: each alert's ``kind``,
``subject``, ``state`` (firing; resolved too with ``?all=true``), ``severity``, ``summary``,
``cluster_id``/``node_id``/``job_id``, ``first_at``, ``last_sent_at``, ``sent``; newest first.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import flask
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from services.observability import alerts, metrics
from shared.adapters.docstore import API_RESOURCES
from shared.ports import Clock, DocStore, EventLog


class Guard(Protocol):
    """The API's guard (``services.api.context.Guard``; not imported: the API sits above)."""

    def check(self, authorization: str | None, permission: str, project: str) -> Any: ...


_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 405: "UNIMPLEMENTED"}


VIEW_PERMISSION = "aiplatform.modelDevelopmentClusters.list"  # every role has it
PATHS = ("/metrics", "/alerts.json")


@dataclass
class Observability:
    """The two endpoints over one store; ``open_access`` skips the token (loopback only)."""

    store: DocStore
    clock: Clock
    guard: Guard | None
    open_access: bool
    event_log: EventLog | None = None
    _registry: CollectorRegistry | None = field(default=None, init=False)

    def registry(self) -> CollectorRegistry:
        if self._registry is None:
            self._registry = metrics.registry(self.store, self.clock, event_log=self.event_log)
        return self._registry

    def handle(self, request: flask.Request) -> flask.Response | None:
        """The answer for one of ``PATHS``; None for any other path."""
        if request.path not in PATHS:
            return None
        if request.method != "GET":
            return _error(405, f"{request.method} is not a method of {request.path}; use GET")
        denied = self._check(request)
        if denied is not None:
            return denied
        scope = self._scope(request)
        if request.path == "/metrics":
            reg = self.registry() if scope is None else metrics.registry(
                self.store, self.clock, clusters=scope)
            return flask.Response(metrics.render(reg), status=200,
                                  content_type=CONTENT_TYPE_LATEST)
        flag = request.args.get("all", "false").lower()
        if flag not in ("true", "false", "1", "0"):
            return _error(400, "all: must be true or false")
        now = self.clock.now()
        tick = metrics.last_tick(self.store.read(alerts.CONTROLLER_TICKS, {}))
        stored = self.store.read(alerts.ALERTS, {})
        if scope is not None:  # one project's clusters' alerts; the controller's liveness
            stored = [{**d, "cluster_id": scope[d["cluster_id"]]} for d in stored
                      if d.get("cluster_id") in scope]
        listed = alerts.listing(stored, now, tick, include_resolved=flag in ("true", "1"),
                                executors=self.store.read(alerts.EXECUTORS, {})
                                if scope is None else ())
        return flask.Response(json.dumps({"alerts": listed, "now": now}, indent=1),
                              status=200, mimetype="application/json")

    def _scope(self, request: flask.Request) -> dict[str, str] | None:
        """The clusters this caller may see: all on loopback or with no ``?project=`` (the
        guard then asked for a token bound to every project); else the named project's, by
        domain id (a record's ``domain``, services.api.ids) with the id the project knows."""
        project = request.args.get("project")
        if self.open_access or not project:
            return None
        records = self.store.read(API_RESOURCES, {"kind": "cluster", "project": project})
        seen = Counter(str(d["id"]) for d in records)  # one id in two locations: say which
        return {str(d.get("domain") or d["id"]): str(d["id"]) if seen[str(d["id"])] == 1
                else f"{d['location']}/{d['id']}" for d in records}

    def _check(self, request: flask.Request) -> flask.Response | None:
        if self.open_access:
            return None
        if self.guard is None:
            return _error(403, f"{request.path} is not served here")
        project = request.args.get("project") or "*"
        try:
            self.guard.check(request.headers.get("Authorization"), VIEW_PERMISSION, project)
        except Exception as exc:  # the API's ApiError: a 401 or 403 in google.rpc.Status form
            body, status = getattr(exc, "body", None), getattr(exc, "http_status", None)
            if body is None or not isinstance(status, int):
                raise
            return flask.Response(json.dumps(body(), indent=1), status=status,
                                  mimetype="application/json")
        return None


def _error(status: int, message: str) -> flask.Response:
    name = _STATUS[status]
    body = {"error": {"code": status, "message": message, "status": name}}
    return flask.Response(json.dumps(body, indent=1), status=status,
                          mimetype="application/json")


def add_routes(app: flask.Flask, obs: Observability) -> None:
    """``/metrics`` and ``/alerts.json`` on a Flask app (``mtc serve``)."""
    def view() -> Any:
        return obs.handle(flask.request)

    for path in PATHS:
        app.add_url_rule(path, endpoint=f"mtc_observability_{path}", view_func=view,
                         methods=["GET", "POST", "PUT", "PATCH", "DELETE"])


def wrap(dispatch: Callable[[flask.Request], flask.Response], obs: Callable[[], Observability]
         ) -> Callable[[flask.Request], flask.Response]:
    """A functions-framework handler that answers ``PATHS`` itself, the rest by ``dispatch``."""
    def handler(request: flask.Request) -> flask.Response:
        if request.path in PATHS:
            answer = obs().handle(request)
            assert answer is not None
            return answer
        return dispatch(request)

    return handler
