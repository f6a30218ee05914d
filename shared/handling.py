"""Runs one handler on one delivered event, with the guarantees every service needs.

- idempotency: the key (service + CloudEvent source + id) is recorded in the same
  transaction as the state change, so a duplicate is acknowledged and does nothing;
- staleness: events older than the configured age are dropped with a log line;
- errors: a PermanentError (bad event, invalid transition) is dead-lettered and
  acknowledged, anything else is re-raised so the transport redelivers;
- the outbox: events the handler emitted are published only after commit.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shared.config import ControlPlaneConfig
from shared.domain.errors import PermanentError
from shared.domain.events import Envelope, Event
from shared.ports import Clock, Compute, EventLog, Outbox, Publisher

log = logging.getLogger("mtc.handling")


class DeadLetters(Protocol):
    def dead_letter(self, envelope: Envelope | None, service: str, reason: str,
                    raw: Any = None) -> None: ...


class Outcome(enum.StrEnum):
    HANDLED = "handled"
    DUPLICATE = "duplicate"
    STALE = "stale"
    DEAD_LETTERED = "dead-lettered"


@dataclass(frozen=True)
class Deps:
    """Everything a handler may touch; bootstrap builds it, tests build it with fakes."""

    uow: Callable[[], Any]  # returns a fresh UnitOfWork (a DocUnitOfWork in practice)
    clock: Clock
    compute: Compute
    publisher: Publisher
    config: ControlPlaneConfig
    dead_letters: DeadLetters
    event_log: EventLog | None = None
    outbox: Outbox | None = None


Handler = Callable[[Any, Any, Deps], None]  # (event, uow, deps)


def run_handler(service: str, handler: Handler, envelope: Envelope, deps: Deps) -> Outcome:
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
            handler(envelope.event, uow, deps)
            uow.mark_processed(key, now)
            uow.commit()
            committed = uow.committed
    except PermanentError as exc:
        log.warning("%s: %s %s dead-lettered: %s", service, envelope.type, envelope.id, exc)
        deps.dead_letters.dead_letter(envelope, service, str(exc))
        return Outcome.DEAD_LETTERED
    publish_all(deps, committed)
    return Outcome.HANDLED


def publish_all(deps: Deps, envelopes: list[Envelope]) -> None:
    """Publish after commit; what fails here stays in the outbox for the sweeper."""
    for env in envelopes:
        deps.publisher.publish(env)
        if deps.outbox is not None:
            deps.outbox.mark_published([env.id])


def emit_now(deps: Deps, event: Event, source: str) -> Envelope:
    """Publish an event that is not part of a handler's transaction (API calls, compute)."""
    from shared.adapters.docstore import make_envelope

    env = make_envelope(event, source, deps.clock.now())
    deps.publisher.publish(env)
    return env
