"""What every API call runs against: the runtime, authentication, audit, and the records the
API keeps beside the domain (each resource's project and location, its wire form, Operations).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.api.audit import AnonymousBudget
from services.api.auth import Principal
from services.api.errors import ApiError, not_found
from services.api.names import Parent
from shared.adapters.docstore import API_RESOURCES
from shared.domain.errors import Conflict, InvalidTransition, NotFound, ValidationError
from shared.handling import Runtime, command_unit

RESOURCES = API_RESOURCES  # {kind, id, project, location, parent, resource (wire), created}


class Guard(Protocol):
    """Authentication and authorization (services.api.auth)."""

    def check(self, authorization: str | None, permission: str, project: str) -> Principal: ...

    def identify(self, authorization: str | None) -> Principal: ...

    def authorize(self, principal: Principal, permission: str, project: str) -> None: ...


class Audit(Protocol):
    def record(self, *, principal: str, permission: str, resource: str, method: str,
               status: int, now: float, reason: str = "") -> object: ...

    def prune(self, now: float, limit: int = 5_000) -> int: ...


@dataclass
class ApiContext:
    runtime: Runtime
    guard: Guard
    audit: Audit | None = None
    max_wait_s: float = 60.0
    # at most this many :wait calls hold a request thread at once; the others answer at
    # once with the current state (AIP-151 lets a server return early): waiting clients,
    # a viewer's included, can never take every thread from the calls that change things
    wait_slots: threading.BoundedSemaphore | None = None
    sleep: Callable[[float], None] = field(default=time.sleep)
    slurm_rest: Any = None  # the Slurm Job API's SlurmRestConfig; None: from the environment
    anonymous: AnonymousBudget = field(default_factory=AnonymousBudget)

    @property
    def now(self) -> float:
        return self.runtime.deps.clock.now()

    def refresh(self) -> None:
        """Let the control plane catch up before a read (embedded: deliver what is queued),
        so a GET shows current state."""
        self.runtime.after_request()

    @contextmanager
    def unit(self) -> Iterator[Any]:
        """One transaction; domain errors become API errors; events go out after commit.
        Within a GET (``reading``) it is read-only: a snapshot that takes no locks."""
        try:
            with command_unit(self.runtime.deps, read_only=READING.get()) as uow:
                yield uow
        except ValidationError as exc:
            raise ApiError("INVALID_ARGUMENT", str(exc), [_violation(exc)]) from exc
        except NotFound as exc:
            raise ApiError("NOT_FOUND", str(exc)) from exc
        except (Conflict, InvalidTransition) as exc:
            raise ApiError("FAILED_PRECONDITION", str(exc)) from exc
        self.runtime.after_request()


READING: ContextVar[bool] = ContextVar("mtc_api_reading", default=False)
"""True while the API answers a GET (``http._call``): its units of work are read-only."""


def _violation(exc: ValidationError) -> Any:
    from services.api.errors import FieldViolation

    return FieldViolation(exc.path, exc.reason)


def resource_key(kind: str, resource_id: str) -> str:
    return f"{kind}:{resource_id}"


def load_record(uow: Any, kind: str, resource_id: str, parent: Parent, name: str
                ) -> dict[str, Any]:
    """The API's record of a resource, if it belongs to ``parent``: else NOT_FOUND (a
    resource in another project is as absent as one that never was)."""
    record = uow.record(RESOURCES, resource_key(kind, resource_id))
    if record is None or record["parent"] != parent.name:
        raise not_found(name)
    return record  # type: ignore[no-any-return]


def save_record(uow: Any, kind: str, resource_id: str, parent: Parent,
                resource: dict[str, Any], now: float, created: float | None = None) -> None:
    uow.put_record(RESOURCES, resource_key(kind, resource_id), {
        "kind": kind, "id": resource_id, "parent": parent.name, "project": parent.project,
        "location": parent.location, "resource": resource,
        "created": now if created is None else created, "time": now})


def records_of(uow: Any, kind: str, parent: Parent) -> list[dict[str, Any]]:
    return sorted(uow.records(RESOURCES, {"kind": kind, "parent": parent.name}),
                  key=lambda r: (r["created"], r["id"]))
