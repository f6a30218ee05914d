"""The HTTP API: clusters and custom jobs, JSON in and out, errors as JSON with a 4xx.

Routes (shaped like the managed-training APIs users know):
  POST   /v1/clusters                      create (body: cluster spec)     201
  GET    /v1/clusters                      list
  GET    /v1/clusters/{id}                 get
  PATCH  /v1/clusters/{id}                 update (resize pools, re-draw partitions)
  DELETE /v1/clusters/{id}                 delete                          202
  GET    /v1/clusters/{id}/nodes           nodes (sinfo-like)
  POST   /v1/clusters/{id}/customJobs      submit (body: CustomJob; ?customJobId= for retries)
  GET    /v1/clusters/{id}/customJobs      list
  GET    /v1/customJobs/{id}               get
  POST   /v1/customJobs/{id}:cancel        cancel
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import flask

from services.job_submission import handlers as h
from shared.domain.errors import Conflict, InvalidTransition, NotFound, ValidationError
from shared.handling import Runtime, command_unit
from shared.views import cluster_view, job_view, node_view

Route = tuple[str, re.Pattern[str], Callable[..., tuple[Any, int]]]


def _error(code: int, status: str, message: str, field: str | None = None) -> flask.Response:
    body: dict[str, Any] = {"error": {"code": code, "status": status, "message": message}}
    if field is not None:
        body["error"]["field"] = field
    return flask.Response(json.dumps(body), status=code, mimetype="application/json")


def _body(request: flask.Request) -> Any:
    raw = request.get_data(cache=True)
    if not raw:
        raise ValidationError("(body)", "a JSON body is required")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError("(body)", f"is not valid JSON: {exc.msg} at line {exc.lineno}"
                              ) from exc


def dispatch(request: flask.Request, rt: Runtime) -> flask.Response:
    path = request.path.rstrip("/") or "/"
    allowed = []
    for method, pattern, fn in ROUTES:
        match = pattern.fullmatch(path)
        if not match:
            continue
        allowed.append(method)
        if method != request.method:
            continue
        try:
            with command_unit(rt.deps) as uow:
                result, status = fn(request, uow, rt.deps, *match.groups())
        except ValidationError as exc:
            return _error(400, "INVALID_ARGUMENT", str(exc), exc.path)
        except NotFound as exc:
            return _error(404, "NOT_FOUND", str(exc))
        except (Conflict, InvalidTransition) as exc:
            return _error(409, "FAILED_PRECONDITION", str(exc))
        rt.after_request()
        return flask.Response(json.dumps(result, indent=1), status=status,
                              mimetype="application/json")
    if allowed:
        return _error(405, "METHOD_NOT_ALLOWED", f"{request.method} not allowed on {path}; "
                      f"use {', '.join(sorted(set(allowed)))}")
    return _error(404, "NOT_FOUND", f"no route {path}")


def _create_cluster(req: flask.Request, uow: Any, deps: Any) -> tuple[Any, int]:
    return cluster_view(h.create_cluster(_body(req), uow, deps)), 201


def _list_clusters(req: flask.Request, uow: Any, deps: Any) -> tuple[Any, int]:
    return {"clusters": [cluster_view(c) for c in h.list_clusters(uow)]}, 200


def _get_cluster(req: flask.Request, uow: Any, deps: Any, cid: str) -> tuple[Any, int]:
    return cluster_view(h.get_cluster(cid, uow)), 200


def _update_cluster(req: flask.Request, uow: Any, deps: Any, cid: str) -> tuple[Any, int]:
    return cluster_view(h.update_cluster(cid, _body(req), uow, deps)), 200


def _delete_cluster(req: flask.Request, uow: Any, deps: Any, cid: str) -> tuple[Any, int]:
    return cluster_view(h.delete_cluster(cid, uow, deps)), 202


def _nodes(req: flask.Request, uow: Any, deps: Any, cid: str) -> tuple[Any, int]:
    h.get_cluster(cid, uow)
    nodes = sorted(uow.nodes.list(cid), key=lambda n: n.node_id)
    return {"nodes": [node_view(n) for n in nodes]}, 200


def _submit(req: flask.Request, uow: Any, deps: Any, cid: str) -> tuple[Any, int]:
    job_id = req.args.get("customJobId")
    return job_view(h.submit_job(cid, _body(req), uow, deps, job_id)), 201


def _list_jobs(req: flask.Request, uow: Any, deps: Any, cid: str) -> tuple[Any, int]:
    h.get_cluster(cid, uow)
    return {"customJobs": [job_view(j) for j in h.list_jobs(uow, cid)]}, 200


def _get_job(req: flask.Request, uow: Any, deps: Any, jid: str) -> tuple[Any, int]:
    return job_view(h.get_job(jid, uow)), 200


def _cancel_job(req: flask.Request, uow: Any, deps: Any, jid: str) -> tuple[Any, int]:
    return job_view(h.cancel_job(jid, uow, deps)), 200


_ID = r"([a-z][a-z0-9-]*)"
ROUTES: list[Route] = [
    ("POST", re.compile(r"/v1/clusters"), _create_cluster),
    ("GET", re.compile(r"/v1/clusters"), _list_clusters),
    ("GET", re.compile(rf"/v1/clusters/{_ID}"), _get_cluster),
    ("PATCH", re.compile(rf"/v1/clusters/{_ID}"), _update_cluster),
    ("DELETE", re.compile(rf"/v1/clusters/{_ID}"), _delete_cluster),
    ("GET", re.compile(rf"/v1/clusters/{_ID}/nodes"), _nodes),
    ("POST", re.compile(rf"/v1/clusters/{_ID}/customJobs"), _submit),
    ("GET", re.compile(rf"/v1/clusters/{_ID}/customJobs"), _list_jobs),
    ("GET", re.compile(rf"/v1/customJobs/{_ID}"), _get_job),
    ("POST", re.compile(rf"/v1/customJobs/{_ID}:cancel"), _cancel_job),
]
