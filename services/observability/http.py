"""``GET /metrics`` (Prometheus text format) and ``GET /alerts.json`` (the alerts, for the
console), on ``mtc serve`` and on the Google Cloud ``api`` function.

Access: both need a bearer token everywhere, loopback included: jobs run on the server's
host and share its network, so an address says nothing about who calls. A token of any
role (viewer and up) sees the projects it is bound to: a token bound to every project
(``*``) sees the fleet; one bound to some projects sees their clusters only. ``?project=``
narrows to one project, which the token must be bound to (else 403). Prometheus sends a
token with ``authorization: {credentials_file: ...}`` in its scrape config.

``/alerts.json`` answers ``{"alerts": [...], "now": <unix time>}``: each alert's ``kind``,
``subject``, ``state`` (firing; resolved too with ``?all=true``), ``severity``, ``summary``,
``cluster_id``/``node_id``/``job_id``, ``first_at``, ``last_sent_at``, ``sent``; newest first.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import flask
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from services.observability import alerts, metrics
from shared.adapters.docstore import API_RESOURCES
from shared.ports import Clock, DocStore, EventLog


class Guard(Protocol):
    """The API's guard (``services.api.context.Guard``; not imported: the API sits above)."""

    def identify(self, authorization: str | None) -> Any: ...

    def authorize(self, principal: Any, permission: str, project: str) -> None: ...


_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 405: "UNIMPLEMENTED"}


VIEW_PERMISSION = "aiplatform.modelDevelopmentClusters.list"  # every role but node-agent has it
PATHS = ("/metrics", "/alerts.json")
FLEET = "*"  # a binding on every project: the whole fleet is the caller's to see


class Denied(Exception):
    """A refusal already worded as the answer to send."""

    def __init__(self, response: flask.Response) -> None:
        super().__init__(response.status)
        self.response = response


@dataclass
class Observability:
    """The two endpoints over one store, behind ``guard`` (None: not served here)."""

    store: DocStore
    clock: Clock
    guard: Guard | None
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
        try:
            projects = self._projects(request)
        except Denied as exc:
            return exc.response
        scope = None if projects is None else self._scope(projects)
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
        if scope is not None:  # the caller's clusters' alerts; the controller's liveness
            stored = [{**d, "cluster_id": scope[d["cluster_id"]]} for d in stored
                      if d.get("cluster_id") in scope]
        listed = alerts.listing(stored, now, tick, include_resolved=flag in ("true", "1"),
                                executors=self.store.read(alerts.EXECUTORS, {})
                                if scope is None else ())
        return flask.Response(json.dumps({"alerts": listed, "now": now}, indent=1),
                              status=200, mimetype="application/json")

    def _projects(self, request: flask.Request) -> list[str] | None:
        """The projects this caller sees (None: the fleet), or ``Denied``: the project of
        ``?project=`` if the caller may view it; else every project the caller may view."""
        if self.guard is None:
            raise Denied(_error(403, f"{request.path} is not served here"))
        guard = self.guard
        principal = _answer(lambda: guard.identify(request.headers.get("Authorization")))
        asked = request.args.get("project")
        if asked:
            _answer(lambda: guard.authorize(principal, VIEW_PERMISSION, asked))
            return [asked]
        if self._may_view(principal, FLEET):
            return None
        bound = {str(project) for project, _role in getattr(principal, "bindings", ())}
        mine = sorted(p for p in bound if self._may_view(principal, p))
        if not mine:  # a node agent's token, say: the 403 names what it lacks
            _answer(lambda: guard.authorize(principal, VIEW_PERMISSION, FLEET))
        return mine

    def _may_view(self, principal: Any, project: str) -> bool:
        assert self.guard is not None
        try:
            self.guard.authorize(principal, VIEW_PERMISSION, project)
        except Exception as exc:  # the API's ApiError (a 403) is a no; anything else a bug
            if _as_response(exc) is None:
                raise
            return False
        return True

    def _scope(self, projects: list[str]) -> dict[str, str]:
        """The clusters of ``projects``, by domain id (a record's ``domain``,
        services.api.ids), each with the id its project knows; an id two of them share is
        told apart by location, and by project too when several are seen."""
        records = [d for project in projects for d in self.store.read(
            API_RESOURCES, {"kind": "cluster", "project": project})]
        seen = Counter(str(d["id"]) for d in records)
        where = "{project}/{location}/{id}" if len(projects) > 1 else "{location}/{id}"
        return {str(d.get("domain") or d["id"]): str(d["id"]) if seen[str(d["id"])] == 1
                else where.format(project=d["project"], location=d["location"], id=d["id"])
                for d in records}


T = TypeVar("T")


def _answer(call: Callable[[], T]) -> T:
    """``call()``, with the API's 401/403 turned into ``Denied``."""
    try:
        return call()
    except Exception as exc:
        response = _as_response(exc)
        if response is None:
            raise
        raise Denied(response) from exc


def _as_response(exc: Exception) -> flask.Response | None:
    """The API's ApiError as its ``google.rpc.Status`` answer; None for any other error."""
    body, status = getattr(exc, "body", None), getattr(exc, "http_status", None)
    if body is None or not isinstance(status, int):
        return None
    return flask.Response(json.dumps(body(), indent=1), status=status,
                          mimetype="application/json")


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
