"""The console's endpoints: each deployed model's replicas (node, state), its share of the
traffic, and its predictions so far (by status, p50/p99 latency from the router's histogram,
bucket bounds) in the projects the caller may view."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from services.api.context import RESOURCES
from services.api.errors import ApiError
from services.api.serving_router import LATENCY_BUCKETS, STATS, replica_states

LIST_ENDPOINTS = "aiplatform.endpoints.list"
MAX_ENDPOINTS = 100


def quantile(row: Sequence[float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` (None: no request yet; the last
    bound's double when it is past every bound)."""
    total = row[-2] if row else 0
    if not total:
        return None
    for i, bound in enumerate(LATENCY_BUCKETS):
        if row[i] >= q * total:
            return bound
    return LATENCY_BUCKETS[-1] * 2


def endpoints(uow: Any, check: Callable[[str, str], str]) -> dict[str, Any]:
    requests, latency, _ = STATS.snapshot()
    allowed: dict[str, bool] = {}
    out = []
    for record in sorted(uow.records(RESOURCES, {"kind": "endpoint"}),
                         key=lambda r: (r["parent"], r["created"], r["id"])):
        project = record["project"]
        if project not in allowed:
            try:
                check(LIST_ENDPOINTS, project)
                allowed[project] = True
            except ApiError as exc:
                if exc.http_status == 401:
                    raise
                allowed[project] = False
        if not allowed[project]:
            continue
        name = f"{record['parent']}/endpoints/{record['id']}"
        split = record["resource"].get("trafficSplit") or {}
        models = []
        for entry in record["resource"].get("deployedModels") or []:
            row = latency.get((name, entry["id"]), [])
            codes = {code: n for (e, d, code), n in requests.items()
                     if e == name and d == entry["id"]}
            models.append({"id": entry["id"], "model": f"{entry['model']}@"
                           f"{entry['modelVersionId']}", "traffic": split.get(entry["id"], 0),
                           "replicas": replica_states(uow, entry), "requests": codes,
                           "p50S": quantile(row, 0.5), "p99S": quantile(row, 0.99)})
        out.append({"name": name, "id": record["id"], "project": project,
                    "displayName": record["resource"].get("displayName", ""),
                    "deployedModels": models})
        if len(out) >= MAX_ENDPOINTS:
            break
    return {"endpoints": out}
