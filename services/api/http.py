"""The HTTP surface: dispatch, authentication, authorization, audit and the GET retry.

Every route (``services.api.routes``) names the Vertex permission it needs; every call is
authenticated, authorized against the project in its path, and (when it changes something)
audited. Bodies are checked by ``services.api.bodies``; every error is a
``google.rpc.Status``, never a bare 500.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import flask
import pydantic_core
from werkzeug.exceptions import HTTPException, NotFound

from services.api import bodies, storage
from services.api.bodies import MAX_BODY_BYTES, audit_reason, read_body
from services.api.call import Call
from services.api.context import READING, ApiContext
from services.api.errors import ApiError
from services.api.names import parent
from services.api.openapi import document
from services.api.routes import ROUTES, Route
from shared.domain.errors import StorageFull, TransientError

__all__ = ["ROUTES", "Route", "create_app", "dispatch", "http_error_body"]

log = logging.getLogger("mtc.api")


def _json(body: Any, status: int) -> flask.Response:
    # pydantic-core's encoder writes what json.dumps(indent=1) does (UTF-8, not \u escapes),
    # ten times faster: the pure-Python indenting encoder was a tenth of a list's cost
    return flask.Response(pydantic_core.to_json(body, indent=1), status=status,
                          mimetype="application/json")


def dispatch(request: flask.Request, ctx: ApiContext) -> flask.Response:
    """One request, start to end: route, authenticate, authorize, run, audit, answer."""
    path = request.path
    if storage.serves(path):  # Cloud Storage's JSON API, on the same port
        return storage.dispatch(request, ctx, _audit)
    allowed = []
    for route in ROUTES:
        match = route.pattern.fullmatch(path)
        if match is None:
            continue
        allowed.append(route.method)
        if route.method != request.method:
            continue
        return _run(route, match.groupdict(), request, ctx)
    if allowed:
        error = ApiError("UNIMPLEMENTED", f"{request.method} is not a method of {path}; use "
                         f"{', '.join(sorted(set(allowed)))}", http=405)
        return _json(error.body(), 405)
    return _json(ApiError("NOT_FOUND", f"no such resource path: {path}").body(), 404)


def _run(route: Route, groups: dict[str, str], request: flask.Request, ctx: ApiContext
         ) -> flask.Response:
    who = UNAUTHENTICATED
    resource = path = request.path
    try:
        principal = ctx.guard.identify(request.headers.get("Authorization"))
        who = principal.name
        where = parent(groups["project"], groups["location"])
        # the resource's name (the path less its version), for a principal bound to one
        ctx.guard.authorize(principal, route.permission, where.project,
                            path.split("/", 2)[2] if path.count("/") >= 2 else None)
        call = Call(ctx, where, groups, request.args,
                    lambda required: read_body(request, required=required), who)
        status = 200
        response = _json(_call(route, call, request), status)
    except ApiError as exc:
        status = exc.http_status
        response = _json(exc.body(), status)
        if exc.retry_after:
            response.headers["Retry-After"] = str(exc.retry_after)
    except StorageFull as exc:  # nothing was kept; the same call succeeds once space returns
        log.error("%s %s: %s", request.method, path, exc)
        status = 503
        response = _json(ApiError("UNAVAILABLE", str(exc)).body(), 503)
        response.headers["Retry-After"] = "30"
    except TransientError as exc:  # the store was busy: the caller's retry will do
        log.warning("%s %s: %s", request.method, path, exc)
        status = 503
        response = _json(ApiError("UNAVAILABLE", "the store is busy (a concurrent "
                                  "transaction held what this call reads); retry").body(), 503)
        response.headers["Retry-After"] = "1"
    except Exception:
        log.exception("%s %s failed", request.method, path)
        status = 500
        response = _json(ApiError("INTERNAL", "internal error; the server log has the "
                                  "details").body(), 500)
    if route.mutates and ctx.audit is not None:  # denied calls too: who tried what
        _audit(ctx, route, request, who, status, resource)
    return response


def _audit(ctx: ApiContext, route: Route, request: flask.Request, who: str, status: int,
           resource: str) -> None:
    reason = audit_reason(request) if route.reasoned else ""
    if who == UNAUTHENTICATED:
        skipped = ctx.anonymous.admit(ctx.now)
        if skipped is None:
            return
        if skipped:
            reason = f"{skipped} more unauthenticated call(s) not recorded before this one"
    assert ctx.audit is not None
    try:
        ctx.audit.record(principal=who, permission=route.permission, resource=resource,
                         method=request.method, status=status, now=ctx.now, reason=reason)
    except StorageFull as exc:  # the answer stands; the log keeps what the record would have
        log.error("audit record not stored (%s): %s %s %s by %s -> %d", exc, request.method,
                  resource, route.permission, who, status)


UNAUTHENTICATED = "(unauthenticated)"  # the audit's caller of a call no token identified
READ_RETRIES_S = (0.05, 0.1, 0.2, 0.4)  # waits before each retry of a read the store refused


def _call(route: Route, call: Call, request: flask.Request) -> Any:
    """The route, with a read retried when the store answers a transient error (Firestore
    aborts a transaction's read that waits on a concurrent writer's lock). A read has no
    effect to repeat; a write is not retried here: a commit that timed out may have landed,
    so its caller decides (it gets 503 UNAVAILABLE)."""
    if request.method != "GET":
        return route.handler(call)
    reading = READING.set(True)  # its units of work are read-only: no locks to contend on
    try:
        for wait_s in READ_RETRIES_S:
            try:
                return route.handler(call)
            except TransientError as exc:
                log.info("%s %s: %s; retrying in %gs", request.method, request.path, exc,
                         wait_s)
                time.sleep(wait_s)
        return route.handler(call)
    finally:
        READING.reset(reading)


def create_app(ctx: ApiContext) -> flask.Flask:
    """The Flask app ``mtc serve`` runs; functions-framework calls ``dispatch`` directly."""
    app = flask.Flask("mtc")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES

    @app.route("/openapi.json")
    def openapi() -> flask.Response:
        return _json(document(ROUTES), 200)

    @app.route("/", defaults={"rest": ""}, methods=["GET", "POST", "PATCH", "PUT", "DELETE"])
    @app.route("/<path:rest>", methods=["GET", "POST", "PATCH", "PUT", "DELETE"])
    def everything(rest: str) -> flask.Response:
        return dispatch(flask.request, ctx)

    @app.errorhandler(413)
    def too_large(_: Exception) -> flask.Response:
        return _json(bodies.too_large().body(), 413)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> flask.Response:
        if isinstance(exc, NotFound) and flask.request.url_rule is None:
            # Flask's router matches no segment with a newline in it; the API's routes decide.
            return dispatch(flask.request, ctx)
        return _json(http_error_body(exc), exc.code or 500)

    return app


_HTTP_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                404: "NOT_FOUND", 405: "UNIMPLEMENTED", 409: "ABORTED",
                413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED",
                503: "UNAVAILABLE"}


def http_error_body(exc: HTTPException) -> dict[str, Any]:
    """An error werkzeug raises before the API sees the request, as a google.rpc.Status."""
    code = exc.code or 500
    status = _HTTP_STATUS.get(code, "INVALID_ARGUMENT" if code < 500 else "INTERNAL")
    return ApiError(status, exc.description or exc.name, http=code).body()
