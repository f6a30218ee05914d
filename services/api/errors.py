"""Errors as Google APIs write them: ``google.rpc.Status`` with BadRequest field violations.

Every failure the API answers with is an ``ApiError``; the HTTP layer renders it as
``{"error": {code, message, status, details}}`` so the official clients raise the matching
``google.api_core.exceptions`` class (InvalidArgument, NotFound, PermissionDenied, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# canonical code name -> (HTTP status, google.rpc.Code number)
CANONICAL: dict[str, tuple[int, int]] = {
    "CANCELLED": (499, 1),
    "INVALID_ARGUMENT": (400, 3),
    "DEADLINE_EXCEEDED": (504, 4),
    "NOT_FOUND": (404, 5),
    "ALREADY_EXISTS": (409, 6),
    "PERMISSION_DENIED": (403, 7),
    "RESOURCE_EXHAUSTED": (429, 8),
    "FAILED_PRECONDITION": (400, 9),
    "ABORTED": (409, 10),
    "UNIMPLEMENTED": (501, 12),
    "INTERNAL": (500, 13),
    "UNAVAILABLE": (503, 14),
    "UNAUTHENTICATED": (401, 16),
}
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


@dataclass
class ApiError(Exception):
    """A request the API refuses: canonical status name, message, and optional details."""

    status: str
    message: str
    violations: list[FieldViolation] = field(default_factory=list)
    reason: str = ""  # google.rpc.ErrorInfo reason, e.g. the missing permission's name
    http: int = 0  # an HTTP status other than the canonical one (413, 405)
    retry_after: int = 0  # seconds, as the answer's Retry-After header (0: none)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.status not in CANONICAL:
            raise ValueError(f"unknown canonical status {self.status!r}")

    @property
    def http_status(self) -> int:
        return self.http or CANONICAL[self.status][0]

    @property
    def code(self) -> int:
        return CANONICAL[self.status][1]

    def status_json(self) -> dict[str, Any]:
        """The google.rpc.Status, as an Operation's ``error`` carries it."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        details: list[dict[str, Any]] = []
        if self.violations:
            details.append({"@type": BAD_REQUEST, "fieldViolations": [
                {"field": v.field, "description": v.description} for v in self.violations]})
        if self.reason:
            details.append({"@type": ERROR_INFO, "reason": self.reason,
                            "domain": "aiplatform.googleapis.com"})
        if details:
            out["details"] = details
        return out

    def body(self) -> dict[str, Any]:
        """The HTTP error body: the Status plus its canonical name."""
        status = self.status_json()
        return {"error": {"code": self.http_status, "message": status["message"],
                          "status": self.status, **({"details": status["details"]}
                                                    if "details" in status else {})}}


def invalid(field_path: str, description: str) -> ApiError:
    """A 400 naming one field."""
    return ApiError("INVALID_ARGUMENT", f"{field_path}: {description}",
                    [FieldViolation(field_path, description)])


def not_found(name: str) -> ApiError:
    return ApiError("NOT_FOUND", f"{name} not found")


def unauthenticated(message: str) -> ApiError:
    return ApiError("UNAUTHENTICATED", message)


def permission_denied(permission: str, resource: str) -> ApiError:
    return ApiError("PERMISSION_DENIED",
                    f"Permission '{permission}' denied on resource '{resource}'",
                    reason=permission)
