"""mtc's extension: report a node's health through the API, as its node agent would.

``POST v1beta1/{cluster}/nodes/{node}:reportHealth`` with the faults (XID codes, ECC, DCGM,
heat, disk, a slow speed check): validated by the rules ``mtc node fault`` uses
(``shared.domain.faults``), then injected the same way, so the control plane diagnoses,
drains, repairs and returns the node as it would for a real fault. Only where the compute
backend can take an injected fault (the local fleet); elsewhere health comes from the agents.
"""

from __future__ import annotations

from typing import Any

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
from shared.domain.faults import FaultRequest, check_fault_target, fault_conditions, validate_fault

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


def report_health(ctx: ApiContext, parent: Parent, cluster_id: str, node_id: str, body: Any
                  ) -> dict[str, Any]:
    fault = fault_of(body)
    cluster_name = parent.child("modelDevelopmentClusters", cluster_id)
    name = f"{cluster_name}/nodes/{node_id}"
    inject = getattr(ctx.runtime.deps.compute, "inject_fault", None)
    if inject is None:
        raise ApiError("FAILED_PRECONDITION", "this server's compute backend takes node "
                       "health from its node agents only; it cannot inject a report")
    with ctx.unit() as uow:
        load_record(uow, "cluster", cluster_id, parent, cluster_name)
        node = uow.nodes.get(node_id)
        if node is None or node.cluster_id != cluster_id:
            raise ApiError("NOT_FOUND", f"{name} not found")
        try:
            check_fault_target(node, node_id, "node")
        except NotFound:
            raise ApiError("NOT_FOUND", f"{name} not found") from None
        except ValidationError as exc:
            raise ApiError("FAILED_PRECONDITION", exc.reason) from None
    conditions = fault_conditions(fault, ctx.now)
    try:
        inject(node_id, conditions)
    except LookupError:
        raise ApiError("NOT_FOUND", f"{name} not found (the machine is gone)") from None
    ctx.refresh()
    return ReportNodeHealthResponse(node=name, conditions=[
        ReportedCondition(type=c.type, reason=c.reason) for c in conditions]).to_json()
