"""Runs one handler on one delivered event, with the guarantees every service needs.

- idempotency: the key (service + CloudEvent source + id) is recorded in the same
  transaction as the state change, so a duplicate is acknowledged and does nothing;
- staleness: events older than the configured age are dropped with a log line; a handler
  may find an event stale too (a report observed before the node's last repair) and
  answer ``Outcome.STALE``: it changed nothing, and is recorded (processed) as stale;
- errors: a PermanentError (bad event, invalid transition) is dead-lettered and
  acknowledged, anything else is re-raised so the transport redelivers;
- the outbox: events the handler emitted are published only after commit.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from shared import logs
from shared.config import ControlPlaneConfig
from shared.domain.errors import PermanentError
from shared.domain.events import Envelope
from shared.ports import (
    AdviceSink,
    Clock,
    Compute,
    EventLog,
    Outbox,
    Publisher,
    UnitOfWorkFactory,
    WorkflowRunner,
)

log = logging.getLogger("mtc.handling")


class DeadLetters(Protocol):
    def dead_letter(self, envelope: Envelope | None, service: str, reason: str,
                    raw: Any = None) -> None: ...


class Outcome(enum.StrEnum):
    HANDLED = "handled"
    # handled, and nothing changed but "last seen" (a report that repeats the node's state):
    # committed and recorded as processed, but left out of the timeline (``run_handler``
    # answers it only when asked to)
    UNCHANGED = "unchanged"
    DUPLICATE = "duplicate"
    # older than ``max_event_age_s`` (dropped), or older than what its subject has become (a
    # report observed before the node's last repair: recorded as processed, nothing changed)
    STALE = "stale"
    DEAD_LETTERED = "dead-lettered"


@dataclass(frozen=True)
class Deps:
    """Everything a handler may touch; bootstrap builds it, tests build it with fakes."""

    # a new UnitOfWork to enter once per call; read_only=True: a read-only one
    uow: UnitOfWorkFactory
    clock: Clock
    compute: Compute
    publisher: Publisher
    config: ControlPlaneConfig
    dead_letters: DeadLetters
    event_log: EventLog | None = None
    outbox: Outbox | None = None
    advice: AdviceSink | None = None  # a file the job's program reads (None: the view only)
    workflows: WorkflowRunner | None = None  # provisioning == "workflow": starts executions


# (event, uow, deps) -> None, or Outcome.UNCHANGED when the event changed nothing that
# matters (the bus then leaves it out of the event log), or Outcome.STALE when the event
# describes a past its entity has left and was not acted on
Handler = Callable[[Any, Any, Deps], "Outcome | None"]


class Runtime(Protocol):
    """What an HTTP entry point (the API, the workflow steps) runs its commands against: the
    deps, and what to do after a request (embedded: deliver what it queued)."""

    deps: Deps

    def after_request(self) -> None: ...


def run_handler(service: str, handler: Handler, envelope: Envelope, deps: Deps, *,
                report_unchanged: bool = False) -> Outcome:
    """Run ``handler`` once for ``envelope``. ``report_unchanged``: answer UNCHANGED (rather
    than HANDLED) when the handler says the event changed nothing that matters and emitted
    nothing; the embedded bus asks for it, to keep such events out of the timeline. Such an
    event keeps no idempotency record either: the handler vouches that it is idempotent by
    state (a repeated report that is no newer than the node's last one changes nothing), so
    a heartbeat a second adds no record a second. Transports that answer a push (HTTP) and
    the twin keep the plain HANDLED and the record.

    Every line logged meanwhile names the service, the event and its node, job and cluster
    (``shared.logs.context``)."""
    token = logs.enter(lambda: {"service": service, **event_fields(envelope)})
    try:
        return _run_handler(service, handler, envelope, deps, report_unchanged)
    finally:
        logs.leave(token)


def event_fields(envelope: Envelope) -> dict[str, Any]:
    """The log fields of an envelope: its type and id, and the ids its event carries."""
    event = envelope.event
    fields: dict[str, Any] = {"event_type": envelope.type, "event_id": envelope.id}
    for name in ("node_id", "job_id", "cluster_id"):
        value = getattr(event, name, None)
        if isinstance(value, str) and value:
            fields[name] = value
    return fields


def _run_handler(service: str, handler: Handler, envelope: Envelope, deps: Deps,
                 report_unchanged: bool) -> Outcome:
    now = deps.clock.now()
    key = f"{service}:{envelope.key}"
    if now - envelope.time > deps.config.max_event_age_s:
        log.warning("%s: dropped stale %s %s (%.0f s old)", service, envelope.type,
                    envelope.id, now - envelope.time)
        return Outcome.STALE
    uow = deps.uow()
    try:
        with uow:
            if uow.already_processed(key):
                return Outcome.DUPLICATE
            uow.caused_by(key)
            result = handler(envelope.event, uow, deps)
            unchanged = report_unchanged and result is Outcome.UNCHANGED and not uow.emitted
            stale = result is Outcome.STALE and not uow.emitted
            if not unchanged:
                uow.mark_processed(key, now, expire_at=now + deps.config.idempotency_window_s)
            uow.commit()
            committed = uow.committed
    except PermanentError as exc:
        log.warning("%s: %s %s dead-lettered: %s", service, envelope.type, envelope.id, exc)
        deps.dead_letters.dead_letter(envelope, service, str(exc))
        return Outcome.DEAD_LETTERED
    publish_all(deps, committed)
    if unchanged:
        return Outcome.UNCHANGED
    if stale:
        log.info("%s: %s %s is stale for its subject; not acted on", service, envelope.type,
                 envelope.id)
        return Outcome.STALE
    return Outcome.HANDLED


def publish_all(deps: Deps, envelopes: list[Envelope]) -> None:
    """Publish after commit; what fails here stays in the outbox for the sweeper."""
    for env in envelopes:
        deps.publisher.publish(env)
        if deps.outbox is not None:
            deps.outbox.mark_published([env.id])


T = TypeVar("T")


@contextmanager
def command_unit(deps: Deps, *, key: str = "", read_only: bool = False) -> Iterator[Any]:
    """The API-side twin of ``run_handler``: one unit of work started by a person or a client
    (an HTTP call, a CLI command, a workflow step), committed if the block does not raise,
    then its events published (what fails to publish stays in the outbox for the sweeper).

    ``key`` (a client's request id) makes a retried command emit the same event ids.
    ``read_only`` (a GET): over a read-only transaction, which takes no locks a handler's
    commit would wait on. Errors propagate to the caller, which turns them into an answer (a
    4xx, an exit status)."""
    uow = deps.uow(read_only=True) if read_only else deps.uow()
    with uow:
        uow.caused_by(key)
        yield uow
        uow.commit()
        committed = uow.committed
    publish_all(deps, committed)


def run_command(deps: Deps, command: Callable[[Any], T], *, key: str = "") -> T:
    """``command(uow)`` in a ``command_unit``; returns what it returned."""
    with command_unit(deps, key=key) as uow:
        return command(uow)


class Routes:
    """Service -> {event type -> handler}: the subscriptions a bus delivers by.

    Built by the composition root (``services.wiring``) and handed to every bus, so buses
    depend on this table, never on the services themselves."""

    def __init__(self, table: Mapping[str, Mapping[str, Handler]]) -> None:
        self._table = {service: dict(handlers) for service, handlers in table.items()}
        self._subscribers: dict[str, tuple[tuple[str, Handler], ...]] = {}

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(self._table)

    def subscriptions(self, service: str) -> dict[str, Handler]:
        return self._table.get(service, {})

    def subscribers(self, event_type: str) -> tuple[tuple[str, Handler], ...]:
        found = self._subscribers.get(event_type)
        if found is None:
            found = tuple((service, handlers[event_type])
                          for service, handlers in self._table.items() if event_type in handlers)
            self._subscribers[event_type] = found
        return found

    def families(self) -> dict[str, set[str]]:
        """Event family (topic) -> services subscribed to at least one of its types."""
        out: dict[str, set[str]] = {}
        for service, handlers in self._table.items():
            for type_ in handlers:
                out.setdefault(type_.split(".")[1], set()).add(service)
        return out
