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
from pathlib import Path
from typing import Any, Protocol

from services.api import ids
from services.api.audit import AnonymousBudget
from services.api.auth import Principal
from services.api.errors import ApiError, not_found
from services.api.names import Parent
from shared.adapters.docstore import API_RESOURCES
from shared.domain.errors import Conflict, InvalidTransition, NotFound, ValidationError
from shared.handling import Runtime, command_unit
from shared.ports import PageKey

RESOURCES = API_RESOURCES  # {kind, id, domain, project, location, parent, resource, created}


class Guard(Protocol):
    """Authentication and authorization (services.api.auth)."""

    def check(self, authorization: str | None, permission: str, project: str) -> Principal: ...

    def identify(self, authorization: str | None) -> Principal: ...

    def authorize(self, principal: Principal, permission: str, project: str,
                  resource: str | None = None) -> None: ...


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
    # the output root whose ``gcs/`` tree the API serves as Cloud Storage
    # (``services.api.storage``) and checks package URIs against; None: ``gs://`` is
    # Google's own Cloud Storage (the Google Cloud deployment), served elsewhere
    storage_root: Path | None = None

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


def resource_key(kind: str, domain_id: str) -> str:
    """A record's key: its kind and its domain id (``services.api.ids``)."""
    return f"{kind}:{domain_id}"


def find_record(uow: Any, kind: str, resource_id: str, parent: Parent
                ) -> dict[str, Any] | None:
    """The API's record of ``resource_id`` (the API id) under ``parent``, or None. A record
    written before ids were per parent (no ``domain``) is found at its plain id.

    The store compares the parent before it reads a record (``where``): another project's
    record at the same key (a server-assigned number, an id of the home project) is never
    read, so looking it up costs what looking up an id no one has does."""
    domain_id = ids.domain(uow, parent, resource_id)
    for key in dict.fromkeys((domain_id, resource_id)):
        record = uow.record(RESOURCES, resource_key(kind, key), where={"parent": parent.name})
        if record is not None and (key == domain_id or "domain" not in record):
            return record  # type: ignore[no-any-return]
    return None


def load_record(uow: Any, kind: str, resource_id: str, parent: Parent, name: str
                ) -> dict[str, Any]:
    """The API's record of a resource, if it belongs to ``parent``: else NOT_FOUND (a
    resource in another project is as absent as one that never was)."""
    record = find_record(uow, kind, resource_id, parent)
    if record is None:
        raise not_found(name)
    return record


def create_id(uow: Any, kind: str, resource_id: str, parent: Parent, now: float) -> str:
    """The domain id a create (or an update) of ``resource_id`` under ``parent`` uses: the
    one its record already has, else the mapper's (``services.api.ids``, pinned now)."""
    record = find_record(uow, kind, resource_id, parent)
    if record is not None:
        return ids.domain_of(record)
    return ids.pinned(uow, parent, now).domain(parent, resource_id)


def save_record(uow: Any, kind: str, resource_id: str, parent: Parent,
                resource: dict[str, Any], now: float, created: float | None = None) -> str:
    """Write the record of ``resource_id`` (the API id); returns its domain id."""
    domain_id = create_id(uow, kind, resource_id, parent, now)
    uow.put_record(RESOURCES, resource_key(kind, domain_id), {
        "kind": kind, "id": resource_id, "domain": domain_id, "parent": parent.name,
        "project": parent.project, "location": parent.location, "resource": resource,
        "created": now if created is None else created, "time": now})
    return domain_id


def records_of(uow: Any, kind: str, parent: Parent) -> list[dict[str, Any]]:
    return sorted(uow.records(RESOURCES, {"kind": kind, "parent": parent.name}),
                  key=lambda r: (r["created"], r["id"]))


def records_page(uow: Any, kind: str, parent: Parent, *, after: PageKey | None, limit: int
                 ) -> list[tuple[str, dict[str, Any]]]:
    """(key, record) of one page of the records of ``kind`` under ``parent`` in list order
    (creation, then key), after ``after``: a range of the store's index, not the whole
    collection (``DocTransaction.page``)."""
    return uow.records_page(  # type: ignore[no-any-return]
        RESOURCES, {"kind": kind, "parent": parent.name}, "created", after=after, limit=limit)
