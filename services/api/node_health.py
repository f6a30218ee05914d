"""mtc's extension: report a node's health through the API, as its node agent would.

``POST v1beta1/{cluster}/nodes/{node}:reportHealth`` with the faults (XID codes, ECC, DCGM,
heat, disk, a slow speed check): validated by the rules ``mtc node fault`` uses
(``shared.domain.faults``), then injected the same way, so the control plane diagnoses,
drains, repairs and returns the node as it would for a real fault. Only where the compute
backend can take an injected fault (the local fleet); elsewhere health comes from the agents.

A node agent on the embedded default reports here too (``mtc-agent`` with transport "api"):
a body with ``conditions`` and ``observedAt`` is the agent's own report, published as the
``NodeHealthReported`` its Pub/Sub message would be, with its ORIGINAL observation time, so
health triage ages it (a spooled report sent after an outage can be stale) and orders it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from services.api import ids
from services.api.context import ApiContext, load_record
from services.api.errors import ApiError, FieldViolation, invalid
from services.api.names import Parent
from services.api.wire.health_report import (
    ReportedCondition,
    ReportNodeHealthRequest,
    ReportNodeHealthResponse,
)
from services.api.wiremodel import parse_message
from shared.domain.errors import NotFound, ValidationError
from shared.domain.events import NodeHealthReported
from shared.domain.faults import FaultRequest, check_fault_target, fault_conditions, validate_fault
from shared.ports import FaultInjection

# FaultRequest field -> the wire field that sets it (errors name the wire field)
FIELDS = {"xids": "xids", "ecc_dbe": "eccDbe", "dcgm_level": "dcgmLevel",
          "thermal_c": "thermalC", "disk_used_fraction": "diskUsedFraction",
          "slow_ratio": "slowRatio"}


def fault_of(body: Any) -> FaultRequest:
    """The body as a validated FaultRequest, or a 400 naming the field."""
    m = parse_message(ReportNodeHealthRequest, body)
    fault = FaultRequest(xids=tuple(m.xids), ecc_dbe=m.ecc_dbe,
                         row_remap_failure=bool(m.row_remap_failure), dcgm_level=m.dcgm_level,
                         thermal_c=m.thermal_c, disk_used_fraction=m.disk_used_fraction,
                         slow_ratio=m.slow_ratio)
    if fault.empty:
        raise invalid("(body)", "name at least one fault (xids, eccDbe, rowRemapFailure, "
                      "dcgmLevel, thermalC, diskUsedFraction, slowRatio)")
    try:
        return validate_fault(fault, FIELDS)
    except ValidationError as exc:
        raise ApiError("INVALID_ARGUMENT", f"{exc.path}: {exc.reason}",
                       [FieldViolation(exc.path, exc.reason)]) from None


def _epoch(text: str, field: str) -> float:
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(field, f"is not an RFC 3339 timestamp: {text!r}") from None
    if value.tzinfo is None:
        raise invalid(field, "needs a time zone (use Z)")
    return value.timestamp()


def agent_report(m: ReportNodeHealthRequest, node_id: str, now: float) -> NodeHealthReported:
    """An agent's report as the event its Pub/Sub message would carry; 400s name the field."""
    faults = [w for f, w in FIELDS.items() if getattr(m, f) not in (None, [])]
    if m.row_remap_failure is not None:
        faults.append("rowRemapFailure")
    if faults:
        raise invalid(faults[0], "an agent report (conditions) carries no injected faults")
    if m.observed_at is None:
        raise invalid("observedAt", "is required with conditions")
    observed = _epoch(m.observed_at, "observedAt")
    if observed > now + 300:
        raise invalid("observedAt", "is in the future (more than 5 minutes ahead)")
    conds = []
    for i, c in enumerate(m.conditions):
        since = observed if c.since is None else _epoch(c.since, f"conditions[{i}].since")
        conds.append({"type": c.type, "status": c.status.lower(), "reason": c.reason,
                      "since": since, "details": dict(c.details)})
    return NodeHealthReported(node_id, observed, tuple(conds), source="agent")


def report_health(ctx: ApiContext, parent: Parent, cluster_id: str, node_id: str, body: Any
                  ) -> dict[str, Any]:
    cluster_name = parent.child("modelDevelopmentClusters", cluster_id)
    name = f"{cluster_name}/nodes/{node_id}"
    if isinstance(body, dict) and "conditions" in body:
        return _agent_report(ctx, cluster_id, cluster_name, parent, node_id, body)
    fault = fault_of(body)
    compute = ctx.runtime.deps.compute
    if not isinstance(compute, FaultInjection):
        raise ApiError("FAILED_PRECONDITION", "this server's compute backend takes node "
                       "health from its node agents only; it cannot inject a report")
    with ctx.unit() as uow:
        record = load_record(uow, "cluster", cluster_id, parent, cluster_name)
        node_id = ids.domain_node(ids.domain_of(record), cluster_id, node_id)
        node = uow.nodes.get(node_id)
        if node is None or node.cluster_id != ids.domain_of(record):
            raise ApiError("NOT_FOUND", f"{name} not found")
        try:
            check_fault_target(node, node_id, "node")
        except NotFound:
            raise ApiError("NOT_FOUND", f"{name} not found") from None
        except ValidationError as exc:
            raise ApiError("FAILED_PRECONDITION", exc.reason) from None
    conditions = fault_conditions(fault, ctx.now)
    try:
        compute.inject_fault(node_id, conditions)
    except LookupError:
        raise ApiError("NOT_FOUND", f"{name} not found (the machine is gone)") from None
    ctx.refresh()
    return ReportNodeHealthResponse(node=name, conditions=[
        ReportedCondition(type=c.type, reason=c.reason) for c in conditions]).to_json()


def _agent_report(ctx: ApiContext, cluster_id: str, cluster_name: str, parent: Parent,
                  node_id: str, body: Any) -> dict[str, Any]:
    name = f"{cluster_name}/nodes/{node_id}"
    m = parse_message(ReportNodeHealthRequest, body)
    if not m.conditions:
        raise invalid("conditions", "name at least one condition")
    with ctx.unit() as uow:
        record = load_record(uow, "cluster", cluster_id, parent, cluster_name)
        node_id = ids.domain_node(ids.domain_of(record), cluster_id, node_id)
        event = agent_report(m, node_id, ctx.now)
        node = uow.nodes.get(node_id)
        if node is None or node.cluster_id != ids.domain_of(record):
            raise ApiError("NOT_FOUND", f"{name} not found")
        uow.emit(event)
    return ReportNodeHealthResponse(node=name, conditions=[
        ReportedCondition(type=c["type"], reason=c["reason"]) for c in event.conditions]
    ).to_json()
