"""google.longrunning.Operation and the list/wait messages around it."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.api.wire.custom_job import RpcStatus
from services.api.wire.proto_json import Duration, Message


class Operation(Message):
    name: str
    metadata: dict[str, Any] | None = None
    done: bool = False
    error: RpcStatus | None = None
    response: dict[str, Any] | None = None


class ListOperationsResponse(Message):
    operations: list[Operation] = Field(default_factory=list)
    next_page_token: str = ""


class WaitOperationRequest(Message):
    timeout: Duration | None = Field(default=None, ge=0, le=600)
