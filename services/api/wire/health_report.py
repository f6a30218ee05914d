"""mtc's extension: a node health report sent through the API (``nodes/{node}:reportHealth``).

The faults a node agent could report, as ``mtc node fault`` takes them; the ranges are those
of ``shared.domain.faults`` (checked there again, so every entry point refuses the same).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from services.api.wire.proto_json import Int32, Int64, Message, Timestamp
from shared.domain.faults import THERMAL_MAX_C, THERMAL_MIN_C, XID_MAX, XID_MIN

Xid = Annotated[Int32, Field(ge=XID_MIN, le=XID_MAX)]


class AgentCondition(Message):
    """One condition of a node agent's own report (node-problem-detector shape)."""

    type: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z][A-Za-z0-9]*$")
    status: Literal["TRUE", "FALSE", "UNKNOWN"]
    reason: str = Field(default="", max_length=500)
    since: Timestamp | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class ReportNodeHealthRequest(Message):
    """Either a node agent's own report (``conditions`` with ``observedAt``: what the agent
    observed, sent as it is, however late) or at least one fault to inject: XID codes,
    uncorrectable ECC errors, a row-remap failure, a failed DCGM diagnostic, a temperature,
    disk use, a slow speed check."""

    report_id: str | None = Field(default=None, min_length=1, max_length=64)
    observed_at: Timestamp | None = None
    conditions: list[AgentCondition] = Field(default_factory=list, max_length=64)

    xids: list[Xid] = Field(default_factory=list, max_length=16)
    ecc_dbe: Int64 | None = Field(default=None, ge=1, le=2**31 - 1)
    row_remap_failure: bool | None = None
    dcgm_level: Int32 | None = Field(default=None, ge=1, le=4)
    thermal_c: float | None = Field(default=None, ge=THERMAL_MIN_C, le=THERMAL_MAX_C)
    disk_used_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    slow_ratio: float | None = Field(default=None, gt=0.0, le=1.0)


class ReportedCondition(Message):
    type: str
    reason: str


class ReportNodeHealthResponse(Message):
    """The node and the conditions its (simulated) agent now reports."""

    node: str
    conditions: list[ReportedCondition] = Field(default_factory=list)
