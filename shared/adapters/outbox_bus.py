"""The embedded bus: the outbox in the store *is* the queue.

A handler's events are already in the outbox when its transaction commits; ``pump`` delivers
them to every subscribed service and only then removes them. A process killed mid-pump leaves
the rest in the outbox, and the next command's pump delivers it (handlers are idempotent, so
an event delivered twice changes nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from shared.adapters.docstore import DocOutbox, DocStore, envelope_to_doc
from shared.domain.events import Envelope
from shared.handling import Deps, Outcome, run_handler
from shared.routing import subscribers

log = logging.getLogger("mtc.bus")

DEAD_LETTERS = "dead_letters"


class OutboxBus:
    def __init__(self, store: DocStore) -> None:
        self._store = store
        self.outbox = DocOutbox(store)
        self.listeners: list[Callable[[Envelope, dict[str, Outcome]], None]] = []

    def publish(self, envelope: Envelope) -> None:
        """After a commit: the envelope is already in the outbox, which is the queue."""

    def inject(self, envelope: Envelope) -> None:
        """Events from outside a transaction (compute, agents) join the same queue."""
        self._store.write("outbox", envelope.id, envelope_to_doc(envelope))

    def pump(self, deps: Deps, *, max_events: int = 10_000) -> int:
        delivered = 0
        while delivered < max_events:
            batch = self.outbox.pending(limit=100)
            if not batch:
                break
            for envelope in batch:
                outcomes = {service: run_handler(service, handler, envelope, deps)
                            for service, handler in subscribers(envelope.type)}
                if deps.event_log is not None:
                    deps.event_log.append(envelope, "delivered", _summary(outcomes))
                for listener in self.listeners:
                    listener(envelope, outcomes)
                self.outbox.mark_published([envelope.id])
                delivered += 1
        return delivered


def _summary(outcomes: dict[str, Outcome]) -> str:
    return ",".join(f"{s}={o.value}" for s, o in outcomes.items())


class DocDeadLetters:
    def __init__(self, store: DocStore) -> None:
        self._store = store

    def dead_letter(self, envelope: Envelope | None, service: str, reason: str,
                    raw: Any = None) -> None:
        doc: dict[str, Any] = {"service": service, "reason": reason}
        if envelope is not None:
            doc.update(envelope_to_doc(envelope))
            doc_id = f"{service}:{envelope.key}"
        else:
            doc["raw"] = repr(raw)[:2000]
            doc_id = f"{service}:raw:{abs(hash(doc['raw']))}"
        from shared.adapters.docstore import _doc_id

        self._store.write(DEAD_LETTERS, _doc_id(doc_id), doc)

    def list(self) -> list[dict[str, Any]]:
        return self._store.read(DEAD_LETTERS, {})
