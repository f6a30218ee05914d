"""HTTP endpoints for the provisioning workflow (and the periodic tick), over the step functions.

The Cloud Workflow (``workflows/provision_cluster.workflows.yaml``) only sequences and polls
these; every decision is in ``services.provisioning.handlers``. Each call runs one step in
one unit of work and publishes what it emitted after the commit. Steps are idempotent, so
the workflow may retry any call.

  POST /steps/validate      {cluster_id, generation}          -> {proceed, state, generation}
  POST /steps/create_nodes  {cluster_id, generation}          -> {requested}
  POST /steps/status        {cluster_id}                      -> {done, settling, in_service,
                                                                  failed, state, generation}
  POST /steps/health_check  {cluster_id, generation}          -> {healthy, reason, ...}
  POST /steps/mark_ready    {cluster_id, generation}          -> {ready, state}
  POST /steps/rollback      {cluster_id, generation, reason}  -> {state}
  POST /tick                {}                                -> {ticked, swept}

``/tick`` is for Cloud Scheduler: a ``fleet.ticked`` event per live cluster (heartbeat
timeouts) and an outbox sweep (what a crash left between commit and publish).

Errors: 400 bad body, 404 unknown cluster, 409 invalid transition, 503 after repeated
contention (the caller retries).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import flask

from services.provisioning import handlers as h
from shared.domain.errors import (
    Conflict,
    InvalidTransition,
    NotFound,
    TransientError,
    ValidationError,
)
from shared.domain.events import FleetTicked
from shared.domain.model import ClusterState, NodeRole, NodeState
from shared.domain.validation import require_int, require_str
from shared.handling import Deps, Runtime, command_unit
from shared.ports import UnitOfWork

log = logging.getLogger("mtc.steps")

ATTEMPTS = 5  # a step that loses a transaction to a concurrent handler runs again
PROCEEDING = (ClusterState.PROVISIONING, ClusterState.UPDATING)

Step = Callable[[dict[str, Any], UnitOfWork, Deps], dict[str, Any]]


def _ids(body: dict[str, Any]) -> tuple[str, int]:
    return require_str(body, "cluster_id"), require_int(body, "generation", minimum=1)


def validate(body: dict[str, Any], uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    """Proceed only for the generation the cluster is at, while it is being provisioned."""
    cluster_id, generation = _ids(body)
    cluster = h.stored_cluster(cluster_id, uow)
    proceed = cluster.generation == generation and cluster.state in PROCEEDING
    return {"proceed": proceed, "state": cluster.state.value,
            "generation": cluster.generation}


def create_nodes(body: dict[str, Any], uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    cluster_id, generation = _ids(body)
    return {"requested": h.step_create_nodes(cluster_id, generation, uow, deps)}


def status(body: dict[str, Any], uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    st = h.step_status(require_str(body, "cluster_id"), uow)
    return {"done": st.done, "settling": st.settling, "in_service": st.in_service,
            "failed": st.failed, "state": st.state, "generation": st.generation}


def health_check(body: dict[str, Any], uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    """The initial check: every node the spec asks for is up and passed its checks."""
    cluster_id, generation = _ids(body)
    cluster = h.stored_cluster(cluster_id, uow)
    st = h.step_status(cluster_id, uow)
    nodes = [n for n in uow.nodes.list(cluster_id) if n.state is not NodeState.RETIRED]
    wanted = 1 + sum(p.node_count for p in cluster.spec.node_pools)
    workers = [n for n in nodes if n.role is NodeRole.WORKER]
    failed = sorted(n.node_id for n in nodes if n.state is NodeState.FAILED)
    reason = ""
    if cluster.generation != generation:
        reason = f"superseded by generation {cluster.generation}"
    elif failed:
        reason = f"{len(failed)} node(s) failed: {', '.join(failed)}"
    elif not st.done:
        reason = f"{st.settling} node(s) still settling"
    elif st.in_service < wanted:
        reason = f"{st.in_service} of {wanted} nodes in service"
    return {"healthy": not reason, "reason": reason, "in_service": st.in_service,
            "wanted": wanted, "workers": len(workers), "failed": len(failed)}


def mark_ready(body: dict[str, Any], uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    cluster_id, generation = _ids(body)
    ready = h.step_mark_ready(cluster_id, generation, uow, deps)
    return {"ready": ready, "state": h.stored_cluster(cluster_id, uow).state.value}


def rollback(body: dict[str, Any], uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    cluster_id, generation = _ids(body)
    reason = body.get("reason") or "provisioning failed"
    if not isinstance(reason, str):
        reason = json.dumps(reason)
    h.step_rollback(cluster_id, generation, reason[:500], uow, deps)
    return {"state": h.stored_cluster(cluster_id, uow).state.value}


STEPS: dict[str, Step] = {
    "validate": validate,
    "create_nodes": create_nodes,
    "status": status,
    "health_check": health_check,
    "mark_ready": mark_ready,
    "rollback": rollback,
}


def _json(body: Any, status_code: int = 200) -> flask.Response:
    return flask.Response(json.dumps(body), status=status_code, mimetype="application/json")


def _error(code: int, status_name: str, message: str) -> flask.Response:
    return _json({"error": {"code": code, "status": status_name, "message": message}}, code)


def run_step(step: Step, body: dict[str, Any], rt: Runtime) -> dict[str, Any]:
    """One step in one unit of work, again on contention; publish what it emitted."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with command_unit(rt.deps) as uow:
                result = step(body, uow, rt.deps)
        except TransientError:
            if attempt == ATTEMPTS:
                raise
            time.sleep(0.05 * 2**attempt)
            continue
        rt.after_request()
        return result
    raise AssertionError("unreachable")


def tick(rt: Runtime) -> dict[str, Any]:
    from shared.adapters.outbox import make_envelope

    with rt.deps.uow() as uow:
        clusters = [c.cluster_id for c in uow.clusters.list()
                    if c.state not in (ClusterState.DELETED,)]
    now = rt.deps.clock.now()
    # the embedded bus queues through its outbox (inject); Pub/Sub publishes at once
    send = getattr(rt.deps.publisher, "inject", None) or rt.deps.publisher.publish
    for cluster_id in clusters:
        send(make_envelope(FleetTicked(cluster_id=cluster_id, at=now), "//mtc/scheduler", now))
    swept = 0
    store = getattr(rt, "store", None)
    publisher = getattr(rt, "publisher", None)
    if store is not None and publisher is not None:
        from shared.adapters.outbox import sweep_outbox

        swept = sweep_outbox(store, publisher, min_age_s=10.0, now=now)
    rt.after_request()
    return {"ticked": clusters, "swept": swept}


def dispatch(request: flask.Request, rt: Runtime) -> flask.Response:
    path = request.path.rstrip("/")
    if request.method != "POST":
        return _error(405, "METHOD_NOT_ALLOWED", f"{request.method} not allowed; use POST")
    raw = request.get_data(cache=True)
    try:
        body = json.loads(raw) if raw else {}
    except json.JSONDecodeError as exc:
        return _error(400, "INVALID_ARGUMENT", f"(body): is not valid JSON: {exc.msg}")
    if not isinstance(body, dict):
        return _error(400, "INVALID_ARGUMENT", "(body): must be a JSON object")
    try:
        if path == "/tick":
            return _json(tick(rt))
        name = path.removeprefix("/steps/")
        step = STEPS.get(name) if path.startswith("/steps/") else None
        if step is None:
            return _error(404, "NOT_FOUND", f"no route {path}; steps: {', '.join(STEPS)}")
        return _json(run_step(step, body, rt))
    except ValidationError as exc:
        return _error(400, "INVALID_ARGUMENT", str(exc))
    except NotFound as exc:
        return _error(404, "NOT_FOUND", str(exc))
    except (Conflict, InvalidTransition) as exc:
        return _error(409, "FAILED_PRECONDITION", str(exc))
    except TransientError as exc:
        log.warning("step %s: %s", path, exc)
        return _error(503, "UNAVAILABLE", str(exc))
