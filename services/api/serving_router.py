"""The endpoint's router: ``:predict`` and ``:rawPredict`` to a ready replica, and what a
replica is doing (for a GET and for a deployModel's Operation).

A request goes to a deployed model by the endpoint's traffic split, then to one of its
replicas that runs on a node in service and not draining and answered its health route
(``shared.policies.serving``); a connection failure or a 5xx (a replica dying with its node)
goes on to the next such replica. When none is ready (a single replica moving off a faulty
node) the answer is 503 UNAVAILABLE with ``Retry-After``, never a silent drop. Health is
asked at most every ``HEALTH_FRESH_S`` per replica and attempt: a replica started again
(a new attempt) is asked afresh.
"""

from __future__ import annotations

import collections
import itertools
import random
import threading
import time
from typing import Any

import requests

from services.api import ids
from services.api.context import RESOURCES, ApiContext, load_record, resource_key
from services.api.errors import ApiError, invalid
from services.api.names import Parent
from services.api.wire.endpoints import PredictRequest
from services.api.wiremodel import parse_message
from shared.domain.model import JobState
from shared.policies.serving import (
    ROUTABLE_NODE_STATES,
    ReplicaView,
    replica_state,
    route_order,
    split_target,
)

HOST = "127.0.0.1"  # the local compute's nodes are this host's processes
HEALTH_FRESH_S = 2.0
HEALTH_TIMEOUT_S = 1.0
PREDICT_TIMEOUT_S = 60.0
RETRY_AFTER_S = 2  # a replica moving to a new node is back in seconds on the local compute
_turn = itertools.count()
_healthy_at: dict[tuple[str, int], float] = {}  # (replica job, attempt) -> last 200
_local = threading.local()
LOAD_WINDOW_S = 10.0  # the autoscaler's load: requests per second over this window


class Arrivals:
    """When requests came, per deployed model (``(endpoint key, deployed id)``): the load
    the autoscaler reads. In this process's memory: the server that routes counts."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], collections.deque[float]] = {}
        self._lock = threading.Lock()

    def note(self, key: tuple[str, str], at: float) -> None:
        with self._lock:
            self._seen.setdefault(key, collections.deque()).append(at)

    def rate(self, key: tuple[str, str], now: float) -> float:
        with self._lock:
            seen = self._seen.get(key)
            while seen and seen[0] < now - LOAD_WINDOW_S:
                seen.popleft()
            return len(seen) / LOAD_WINDOW_S if seen else 0.0


ARRIVALS = Arrivals()
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServingStats:
    """Predictions by endpoint, deployed model and HTTP status, their latency (cumulative
    bucket counts and sum) and the scale events: what ``serving_metrics`` exports."""

    def __init__(self) -> None:
        self.requests: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.latency: dict[tuple[str, str], list[float]] = {}  # counts per bucket, +Inf, sum
        self.scales: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._lock = threading.Lock()

    def answered(self, endpoint: str, deployed: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, deployed, str(status))] += 1
            row = self.latency.setdefault((endpoint, deployed),
                                          [0.0] * (len(LATENCY_BUCKETS) + 2))
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    row[i] += 1
            row[-2] += 1
            row[-1] += seconds

    def scaled(self, endpoint: str, deployed: str, direction: str) -> None:
        with self._lock:
            self.scales[(endpoint, deployed, direction)] += 1

    def snapshot(self) -> tuple[dict[Any, int], dict[Any, list[float]], dict[Any, int]]:
        with self._lock:
            return (dict(self.requests), {k: list(v) for k, v in self.latency.items()},
                    dict(self.scales))


STATS = ServingStats()
Placed = tuple[dict[str, Any], bool, str | None, str | None, int]  # replica, running, node,
# the node's state, attempt


def _session() -> requests.Session:
    session: requests.Session | None = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
    return session


def placed(uow: Any, entry: dict[str, Any]) -> list[Placed]:
    """Each replica of a deployed model with its job's and its node's state (one read)."""
    out = []
    for replica in entry.get("replicas") or []:
        job = uow.jobs.get(replica["job"])
        running = job is not None and job.state is JobState.RUNNING and bool(job.node_ids)
        node_id = job.node_ids[0] if running and job is not None else None
        node = uow.nodes.get(node_id) if node_id else None
        out.append((replica, running, node_id, node.state.value if node else None,
                    job.attempt if job is not None else 0))
    return out


_ever_healthy: dict[tuple[str, int], float] = {}  # (replica job, attempt) -> last 200, kept


def healthy(entry: dict[str, Any], replica: dict[str, Any], attempt: int) -> bool:
    key = (replica["job"], attempt)
    seen = _healthy_at.get(key)
    if seen is not None and time.monotonic() - seen < HEALTH_FRESH_S:
        return True
    try:
        answer = _session().get(f"http://{HOST}:{replica['port']}{entry['healthRoute']}",
                                timeout=HEALTH_TIMEOUT_S)
    except requests.RequestException:
        _healthy_at.pop(key, None)
        return False
    if answer.status_code != 200:
        _healthy_at.pop(key, None)
        return False
    _healthy_at[key] = _ever_healthy[key] = time.monotonic()
    return True


def unhealthy_for(replica: dict[str, Any], attempt: int, now: float) -> float | None:
    """Seconds since a replica's attempt last answered its health route, once it has
    answered it at all (a replica still loading its model is starting, not unhealthy);
    None: it never answered, or answers now."""
    key = (replica["job"], attempt)
    last = _ever_healthy.get(key)
    if last is None or key in _healthy_at:
        return None
    return now - last


def views(entry: dict[str, Any], replicas: list[Placed]) -> list[ReplicaView]:
    """The router's view: a replica's health is asked only where it could take requests."""
    return [ReplicaView(r["job"], running, state,
                        running and state in ROUTABLE_NODE_STATES and healthy(entry, r, attempt))
            for r, running, _, state, attempt in replicas]


def replica_states(uow: Any, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """mtc's ``mtcReplicas`` of a deployed model."""
    replicas = placed(uow, entry)
    return [{"replica": r["job"], "node": node, "attempt": attempt,
             "state": replica_state(view)}
            for (r, _, node, _, attempt), view in zip(replicas, views(entry, replicas),
                                                      strict=True)]


def deploy_progress(uow: Any, record: dict[str, Any]
                    ) -> tuple[bool, dict[str, Any] | None, dict[str, Any]]:
    """A deployModel's Operation: done once every replica is ready; an error when the
    model was undeployed first or a replica's job ended."""
    response = record.get("response") or {}
    dm_id = (response.get("deployedModel") or {}).get("id")
    endpoint = uow.record(RESOURCES, resource_key("endpoint", record["target_id"]))
    entry = next((d for d in (endpoint or {}).get("resource", {}).get("deployedModels") or []
                  if d["id"] == dm_id), None)
    if entry is None:
        return True, {"code": 10, "message": f"deployed model {dm_id} was undeployed before "
                      "it was ready"}, {}
    replicas = placed(uow, entry)
    for r, *_ in replicas:
        job = uow.jobs.get(r["job"])
        if job is None or job.terminal:
            detail = (job.error if job is not None else "") or "ended"
            return True, {"code": 13, "message": f"replica {r['job']} {detail}"}, {}
    if all(v.healthy for v in views(entry, replicas)):
        return True, None, response
    return False, None, {}


def predict(ctx: ApiContext, parent: Parent, endpoint_id: str, body: Any, *, raw: bool = False
            ) -> dict[str, Any]:
    """The deployed model's predictions, as Vertex's PredictResponse; ``raw``: the body goes
    to the replica as given and its answer comes back as it is (rawPredict). Counted in
    ``STATS`` by the answer's status, once a deployed model was chosen."""
    started = time.monotonic()
    chosen: list[str] = []
    try:
        out = _predict(ctx, parent, endpoint_id, body, raw, chosen)
    except ApiError as exc:
        if chosen:
            STATS.answered(parent.child("endpoints", endpoint_id), chosen[0], exc.http_status,
                           time.monotonic() - started)
        raise
    STATS.answered(parent.child("endpoints", endpoint_id), chosen[0], 200,
                   time.monotonic() - started)
    return out


def _predict(ctx: ApiContext, parent: Parent, endpoint_id: str, body: Any, raw: bool,
             chosen: list[str]) -> dict[str, Any]:
    if not raw:
        request = parse_message(PredictRequest, body)
        if not request.instances:
            raise invalid("instances", "is required: at least one instance")
        body = request.to_json()
        body.setdefault("instances", [])
    with ctx.unit() as uow:
        record = load_record(uow, "endpoint", endpoint_id, parent,
                             parent.child("endpoints", endpoint_id))
        resource = record["resource"]
        target = _split_target(resource)
        if target is None:
            raise ApiError("FAILED_PRECONDITION", f"{parent.child('endpoints', endpoint_id)} "
                           "has no deployed model that takes traffic: deploy a model first")
        entry = next(d for d in resource["deployedModels"] if d["id"] == target)
        replicas = placed(uow, entry)
    ARRIVALS.note((ids.domain_of(record), entry["id"]), time.monotonic())
    chosen.append(entry["id"])
    by_job = {r["job"]: r for r, *_ in replicas}
    last, broken = "no replica is ready", 0
    for job_id in route_order(views(entry, replicas), next(_turn)):
        replica = by_job[job_id]
        url = f"http://{HOST}:{replica['port']}{entry['predictRoute']}"
        try:
            answer = _session().post(url, json=body, timeout=PREDICT_TIMEOUT_S)
        except requests.RequestException as exc:  # gone with its node: the next one
            _forget(replica)
            last = f"replica {job_id}: {type(exc).__name__}"
            continue
        if answer.status_code >= 500:
            _forget(replica)
            last = f"replica {job_id} answered {answer.status_code}: {answer.text[:200]}"
            broken += answer.status_code == 500  # the model's own failure, not a going replica
            continue
        try:
            out = answer.json()
        except ValueError:
            raise ApiError("INTERNAL", f"the model's server answered {answer.status_code} "
                           f"with a body that is not JSON: {answer.text[:200]}") from None
        if answer.status_code >= 400:
            message = out.get("error") if isinstance(out, dict) else None
            raise ApiError("INVALID_ARGUMENT" if answer.status_code == 400 else
                           "FAILED_PRECONDITION", f"the model refused the request "
                           f"({answer.status_code}): {message or answer.text[:500]}")
        if raw:
            return out if isinstance(out, dict) else {"predictions": out}
        if not isinstance(out, dict) or "predictions" not in out:
            raise ApiError("INTERNAL", "the model's server answered without predictions")
        return {"predictions": out["predictions"], "deployedModelId": entry["id"],
                "model": entry["model"], "modelDisplayName": entry["modelDisplayName"],
                "modelVersionId": entry["modelVersionId"]}
    if broken and broken == len(by_job):  # every replica failed the same request
        raise ApiError("INTERNAL", f"the model failed the request: {last}")
    raise ApiError("UNAVAILABLE", f"{parent.child('endpoints', endpoint_id)}: deployed model "
                   f"{entry['id']} has no ready replica now ({last}); retry after "
                   f"{RETRY_AFTER_S}s", retry_after=RETRY_AFTER_S)


def _split_target(resource: dict[str, Any]) -> str | None:
    return split_target(dict(resource.get("trafficSplit") or {}), random.random())


def _forget(replica: dict[str, Any]) -> None:
    for key in [k for k in _healthy_at if k[0] == replica["job"]]:
        _healthy_at.pop(key, None)
