"""The Slurm Job API's messages: ``modelDevelopmentClusters/{id}:callSlurmRestApi``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from services.api.wire.proto_json import Int32, Message

HttpMethod = Literal["HTTP_METHOD_GET", "HTTP_METHOD_POST", "HTTP_METHOD_DELETE"]


class CallSlurmRestApiRequest(Message):
    """One call to the cluster's slurmrestd: ``path`` under ``/slurm/v0.0.38/``; ``body`` the
    JSON request body (as text, or as an object) for a POST."""

    method: HttpMethod
    path: str = Field(min_length=1, max_length=2048)
    body: str | dict[str, Any] | None = None


class CallSlurmRestApiResponse(Message):
    """slurmrestd's answer: its HTTP status and its JSON body."""

    status: Int32
    structured_body: dict[str, Any] = Field(default_factory=dict)
