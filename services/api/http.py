"""The HTTP surface: Vertex AI's REST paths, bodies, errors and auth, on one Flask app.

Every route names the Vertex permission it needs; every call is authenticated, authorized
against the project in its path, and (when it changes something) audited. Bodies are
bounded (1 MiB), must be UTF-8 JSON objects no deeper than 32 levels; anything else gets a
400 or 413 in ``google.rpc.Status`` form, never a 500.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import flask
from werkzeug.exceptions import HTTPException, NotFound, RequestEntityTooLarge

from services.api import (
    clusters,
    custom_jobs,
    node_health,
    node_ops,
    operations_api,
    slurm_rest,
    tuning_jobs,
)
from services.api import job_logs as logs_api
from services.api import models as models_api
from services.api import training_pipelines as pipelines_api
from services.api.auth import NODE_REPORT
from services.api.context import READING, ApiContext
from services.api.errors import ApiError, FieldViolation
from services.api.names import Parent, parent
from services.api.openapi import document
from shared.domain.errors import TransientError

log = logging.getLogger("mtc.api")
MAX_BODY_BYTES = 1 << 20
MAX_DEPTH = 32
_P = r"projects/(?P<project>[^/:]+)/locations/(?P<location>[^/:]+)"
_V = r"(?P<version>v1|v1beta1)"
_ID = r"(?P<rid>[^/:]+)"


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    permission: str
    call: Callable[[ApiContext, Parent, dict[str, str], flask.Request], tuple[Any, int]]
    reasoned: bool = False  # the body's "reason" goes in the audit record

    @property
    def mutates(self) -> bool:
        return self.method != "GET" and not self.permission.endswith(".wait")


def _route(method: str, path: str, permission: str,
           call: Callable[[ApiContext, Parent, dict[str, str], flask.Request], tuple[Any, int]],
           reasoned: bool = False) -> Route:
    return Route(method, re.compile(path), permission, call, reasoned)


def read_body(request: flask.Request, *, required: bool = True) -> Any:
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise _too_large() from None
    if len(raw) > MAX_BODY_BYTES:
        raise _too_large()
    if not raw.strip():
        if required:
            raise _bad_body("a JSON object is required")
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_body(f"is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad_body(f"is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                        ) from None
    except RecursionError:
        raise _bad_body(f"nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise _bad_body(f"is not JSON: {exc}") from None
    if _depth(value) > MAX_DEPTH:
        raise _bad_body(f"nests deeper than {MAX_DEPTH} levels")
    if not isinstance(value, dict):
        raise _bad_body("must be a JSON object")
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(item, str) and "\x00" in item:
            raise _bad_body("holds a NUL character in a string")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            if any("\x00" in k for k in item):
                raise _bad_body("holds a NUL character in a field name")
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def _bad_body(reason: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", f"(body): {reason}", [FieldViolation("(body)", reason)])


def _too_large() -> ApiError:
    return ApiError("RESOURCE_EXHAUSTED", f"the request body is larger than {MAX_BODY_BYTES} "
                    "bytes", http=413)


# ---------------------------------------------------------------- routes







def _jobs_logs(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
               ) -> tuple[Any, int]:
    return logs_api.read(ctx, p, m["rid"], rank=r.args.get("rank"),
                         attempt=r.args.get("attempt"), size=r.args.get("pageSize"),
                         token=r.args.get("pageToken")), 200







def _clusters_create(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                     ) -> tuple[Any, int]:
    return clusters.create(ctx, p, read_body(r), r.args.get("modelDevelopmentClusterId")), 200


def _clusters_list(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                   ) -> tuple[Any, int]:
    return clusters.list_clusters(ctx, p, filter_text=r.args.get("filter"),
                                  size=r.args.get("pageSize"),
                                  token=r.args.get("pageToken")), 200


def _clusters_get(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                  ) -> tuple[Any, int]:
    return clusters.get(ctx, p, m["rid"]), 200


def _clusters_update(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                     ) -> tuple[Any, int]:
    return clusters.update(ctx, p, m["rid"], read_body(r), force=_flag(r, "force")), 200


def _clusters_delete(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                     ) -> tuple[Any, int]:
    return clusters.delete(ctx, p, m["rid"], force=_flag(r, "force")), 200


def _cluster_nodes(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                   ) -> tuple[Any, int]:
    return clusters.nodes(ctx, p, m["rid"], size=r.args.get("pageSize"),
                          token=r.args.get("pageToken")), 200


def _node_op(verb: str) -> Callable[[ApiContext, Parent, dict[str, str], flask.Request],
                                     tuple[Any, int]]:
    def call(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
             ) -> tuple[Any, int]:
        return node_ops.act(ctx, p, m["rid"], m["node"], verb, read_body(r),
                            m["principal"]), 200
    return call


def _audit_reason(request: flask.Request) -> str:
    try:
        body = json.loads(request.get_data(cache=True) or b"{}")
    except (ValueError, RequestEntityTooLarge):
        return ""
    reason = body.get("reason") if isinstance(body, dict) else None
    return reason[:512] if isinstance(reason, str) else ""


def _flag(r: flask.Request, name: str) -> bool:
    raw = r.args.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise ApiError("INVALID_ARGUMENT", f"{name}: must be true or false",
                       [FieldViolation(name, "must be true or false")])
    return raw in ("true", "1")


def _ops_list(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
              ) -> tuple[Any, int]:
    return operations_api.list_operations(ctx, p, size=r.args.get("pageSize"),
                                          token=r.args.get("pageToken"),
                                          filter_text=r.args.get("filter")), 200


def _ops_get(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
             ) -> tuple[Any, int]:
    return operations_api.get(ctx, p, m["rid"]), 200


def _ops_wait(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
              ) -> tuple[Any, int]:
    return operations_api.wait(ctx, p, m["rid"], read_body(r, required=False)), 200


def _ops_cancel(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                ) -> tuple[Any, int]:
    read_body(r, required=False)
    return operations_api.cancel(ctx, p, m["rid"]), 200


def _ops_delete(ctx: ApiContext, p: Parent, m: dict[str, str], r: flask.Request
                ) -> tuple[Any, int]:
    return operations_api.delete(ctx, p, m["rid"]), 200


def _model_ref(m: dict[str, str]) -> tuple[str, str | None]:
    """``models/{id}`` or ``models/{id}@{version or alias}``."""
    model_id, _, ref = m["rid"].partition("@")
    return model_id, (ref if "@" in m["rid"] else None)


def _no_body(r: flask.Request) -> dict[str, Any]:
    read_body(r, required=False)
    return {}


def _listing(r: flask.Request) -> dict[str, str | None]:
    return {"filter_text": r.args.get("filter"), "size": r.args.get("pageSize"),
            "token": r.args.get("pageToken")}


def _collection_routes(path: str, permission: str, api: ModuleType, id_param: str,
                       lister: str = "list_jobs") -> tuple[Route, ...]:
    """Create, list, get, delete and cancel of one resource collection (custom jobs, tuning
    jobs, training pipelines), each served the same way by its module's functions of those
    names (``lister`` lists); the client's id for a new resource comes in ``id_param``."""
    list_resources = getattr(api, lister)
    return (
        _route("POST", path, f"{permission}.create",
               lambda ctx, p, m, r: (api.create(ctx, p, read_body(r),
                                                r.args.get(id_param) or None), 200)),
        _route("GET", path, f"{permission}.list",
               lambda ctx, p, m, r: (list_resources(ctx, p, **_listing(r)), 200)),
        _route("GET", f"{path}/{_ID}", f"{permission}.get",
               lambda ctx, p, m, r: (api.get(ctx, p, m["rid"]), 200)),
        _route("DELETE", f"{path}/{_ID}", f"{permission}.delete",
               lambda ctx, p, m, r: (api.delete(ctx, p, m["rid"]), 200)),
        _route("POST", f"{path}/{_ID}:cancel", f"{permission}.cancel",
               lambda ctx, p, m, r: (_no_body(r) | api.cancel(ctx, p, m["rid"]), 200)),
    )


MODELS = f"/{_V}/{_P}/models"
PIPELINES = f"/{_V}/{_P}/trainingPipelines"
MO, TP = "aiplatform.models", "aiplatform.trainingPipelines"
REGISTRY_ROUTES: tuple[Route, ...] = (  # the Model Registry and training pipelines
    _route("POST", f"{MODELS}:upload", f"{MO}.create",
           lambda ctx, p, m, r: (models_api.upload(ctx, p, read_body(r)), 200)),
    _route("GET", MODELS, f"{MO}.list",
           lambda ctx, p, m, r: (models_api.list_models(ctx, p, **_listing(r)), 200)),
    _route("GET", f"{MODELS}/{_ID}", f"{MO}.get",
           lambda ctx, p, m, r: (models_api.get(ctx, p, *_model_ref(m)), 200)),
    _route("DELETE", f"{MODELS}/{_ID}", f"{MO}.delete",
           lambda ctx, p, m, r: (models_api.delete(ctx, p, *_model_ref(m)), 200)),
    _route("GET", f"{MODELS}/{_ID}:listVersions", f"{MO}.list",
           lambda ctx, p, m, r: (models_api.list_versions(ctx, p, _model_ref(m)[0],
                                                          **_listing(r)), 200)),
    _route("POST", f"{MODELS}/{_ID}:mergeVersionAliases", f"{MO}.update",
           lambda ctx, p, m, r: (models_api.merge_version_aliases(
               ctx, p, *_model_ref(m), read_body(r)), 200)),
    *_collection_routes(PIPELINES, TP, pipelines_api, "trainingPipelineId", "list_pipelines"),
)


JOBS = f"/{_V}/{_P}/customJobs"
CLUSTERS = f"/(?P<version>v1beta1)/{_P}/modelDevelopmentClusters"
OPS = f"/{_V}/{_P}/operations"
HPT, HT = f"/{_V}/{_P}/hyperparameterTuningJobs", "aiplatform.hyperparameterTuningJobs"
J, C, OP = "aiplatform.customJobs", "aiplatform.modelDevelopmentClusters", "aiplatform.operations"
ROUTES: tuple[Route, ...] = (
    *_collection_routes(JOBS, J, custom_jobs, "customJobId"),
    _route("GET", f"{JOBS}/{_ID}/logs", f"{J}.get", _jobs_logs),
    *_collection_routes(HPT, HT, tuning_jobs, "hyperparameterTuningJobId"),
    _route("POST", CLUSTERS, f"{C}.create", _clusters_create),
    _route("GET", CLUSTERS, f"{C}.list", _clusters_list),
    _route("GET", f"{CLUSTERS}/{_ID}", f"{C}.get", _clusters_get),
    _route("PATCH", f"{CLUSTERS}/{_ID}", f"{C}.update", _clusters_update),
    _route("DELETE", f"{CLUSTERS}/{_ID}", f"{C}.delete", _clusters_delete),
    _route("GET", f"{CLUSTERS}/{_ID}/nodes", f"{C}.get", _cluster_nodes),
    _route("POST", f"{CLUSTERS}/{_ID}/nodes/(?P<node>[^/:]+):reportHealth", NODE_REPORT,
           lambda ctx, p, m, r: (node_health.report_health(ctx, p, m["rid"], m["node"],
                                                           read_body(r)), 200)),
    *(_route("POST", f"{CLUSTERS}/{_ID}/nodes/(?P<node>[^/:]+):{verb}", f"{C}.update",
             _node_op(verb), reasoned=True) for verb in node_ops.VERBS),
    _route("POST", f"{CLUSTERS}/{_ID}:callSlurmRestApi", f"{C}.run",
           lambda ctx, p, m, r: (slurm_rest.call(ctx, p, m["rid"], read_body(r)), 200)),
    _route("GET", OPS, f"{OP}.list", _ops_list),
    _route("GET", f"{OPS}/{_ID}", f"{OP}.get", _ops_get),
    _route("DELETE", f"{OPS}/{_ID}", f"{OP}.delete", _ops_delete),
    _route("POST", f"{OPS}/{_ID}:wait", f"{OP}.wait", _ops_wait),
    _route("POST", f"{OPS}/{_ID}:cancel", f"{OP}.cancel", _ops_cancel),
    *REGISTRY_ROUTES,
)


def _json(body: Any, status: int) -> flask.Response:
    return flask.Response(json.dumps(body, indent=1), status=status,
                          mimetype="application/json")


def dispatch(request: flask.Request, ctx: ApiContext) -> flask.Response:
    """One request, start to end: route, authenticate, authorize, run, audit, answer."""
    path = request.path
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
    who = "-"
    resource = path = request.path
    try:
        where = parent(groups["project"], groups["location"])
        principal = ctx.guard.check(request.headers.get("Authorization"), route.permission,
                                    where.project)
        who = groups["principal"] = principal.name
        body, status = _call(route, ctx, where, groups, request)
        response = _json(body, status)
    except ApiError as exc:
        status = exc.http_status
        response = _json(exc.body(), status)
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
    if route.mutates and ctx.audit is not None and who != "-":
        ctx.audit.record(principal=who, permission=route.permission, resource=resource,
                         method=request.method, status=status, now=ctx.now,
                         reason=_audit_reason(request) if route.reasoned else "")
    return response


READ_RETRIES_S = (0.05, 0.1, 0.2, 0.4)  # waits before each retry of a read the store refused


def _call(route: Route, ctx: ApiContext, where: Parent, groups: dict[str, str],
          request: flask.Request) -> tuple[Any, int]:
    """The route, with a read retried when the store answers a transient error (Firestore
    aborts a transaction's read that waits on a concurrent writer's lock). A read has no
    effect to repeat; a write is not retried here: a commit that timed out may have landed,
    so its caller decides (it gets 503 UNAVAILABLE)."""
    if request.method != "GET":
        return route.call(ctx, where, groups, request)
    reading = READING.set(True)  # its units of work are read-only: no locks to contend on
    try:
        for wait_s in READ_RETRIES_S:
            try:
                return route.call(ctx, where, groups, request)
            except TransientError as exc:
                log.info("%s %s: %s; retrying in %gs", request.method, request.path, exc,
                         wait_s)
                time.sleep(wait_s)
        return route.call(ctx, where, groups, request)
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
        return _json(_too_large().body(), 413)

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
