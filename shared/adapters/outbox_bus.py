"""The embedded bus: the outbox in the store *is* the queue.

A handler's events are already in the outbox when its transaction commits; ``pump`` delivers
them to every subscribed service and only then removes them. A process killed mid-pump leaves
the rest in the outbox, and the next command's pump delivers it (handlers are idempotent, so
an event delivered twice changes nothing).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from shared.adapters.docstore import prune_expired
from shared.adapters.outbox import OUTBOX, DocOutbox, envelope_to_doc
from shared.adapters.outbox import doc_id as outbox_doc_id
from shared.domain.events import Envelope, NodeHealthReported
from shared.handling import Deps, Outcome, Routes, event_fields, run_handler
from shared.ports import DocStore

log = logging.getLogger("mtc.bus")

DEAD_LETTERS = "dead_letters"
MAX_DELIVERY_ATTEMPTS = 10


class OutboxBus:
    def __init__(self, store: DocStore, routes: Routes) -> None:
        self._store = store
        self._routes = routes
        self.outbox = DocOutbox(store)
        self.listeners: list[Callable[[Envelope, dict[str, Outcome]], None]] = []
        self._pruned_at: float | None = None
        # node id -> (id, signature, time, seq) of its health report waiting in the queue
        self._waiting_reports: dict[str, tuple[str, tuple[str, str], float, int]] = {}
        # threads share a bus (mtc serve: request threads inject, the control loop pumps):
        # one lock for the waiting reports, one pump at a time (two would deliver twice)
        self._reports_lock = threading.Lock()
        self._pump_lock = threading.RLock()

    def publish(self, envelope: Envelope) -> None:
        """After a commit: the envelope is already in the outbox, which is the queue."""

    def inject(self, envelope: Envelope) -> None:
        """Events from outside a transaction (compute, agents) join the same queue.

        Conditions are state: a health report that repeats, condition for condition and
        from the same source, a report of the same node still waiting in the queue takes
        that report's place (its id and position, the newer observation time), so a fleet
        whose agents report faster than the bus delivers keeps one waiting report per node
        instead of a growing backlog that starves everything queued behind it. If another
        process delivered the waiting one meanwhile, the write simply queues the newer."""
        doc = envelope_to_doc(envelope)
        event = envelope.event
        if isinstance(event, NodeHealthReported):
            signature = (event.source, json.dumps(event.conditions, sort_keys=True,
                                                  default=str))
            with self._reports_lock:
                waiting = self._waiting_reports.get(event.node_id)
                if waiting is not None and waiting[1] == signature \
                        and waiting[0] != envelope.id:
                    doc.update(id=waiting[0], time=waiting[2], seq=waiting[3])
                else:
                    self._waiting_reports[event.node_id] = (envelope.id, signature,
                                                            doc["time"], doc["seq"])
        self._store.write(OUTBOX, doc["id"], doc)

    def _delivered(self, envelope: Envelope) -> None:
        event = envelope.event
        if isinstance(event, NodeHealthReported):
            with self._reports_lock:
                waiting = self._waiting_reports.get(event.node_id)
                if waiting is not None and waiting[0] == envelope.id:
                    del self._waiting_reports[event.node_id]

    def pump(self, deps: Deps, *, max_events: int = 10_000) -> int:
        """Deliver queued events to every subscriber. A subscriber that raises (a transient
        error) leaves the event queued for the next pump, as Pub/Sub redelivers a nack; after
        MAX_DELIVERY_ATTEMPTS the event is dead-lettered, so nothing crash-loops."""
        with self._pump_lock:
            return self._pump(deps, max_events)

    def _pump(self, deps: Deps, max_events: int) -> int:
        self._prune(deps)
        delivered = 0
        deferred: set[str] = set()
        while delivered < max_events:
            batch = [e for e in self.outbox.pending(limit=100 + len(deferred))
                     if e.id not in deferred]
            if not batch:
                break
            for envelope in batch:
                outcomes, failure = self._deliver(envelope, deps)
                if failure is not None:
                    deferred.add(envelope.id)
                    self._retry_later(envelope, deps, failure)
                    continue
                if deps.event_log is not None and not _unchanged(outcomes):
                    deps.event_log.append(envelope, "delivered", _summary(outcomes))
                for listener in self.listeners:
                    listener(envelope, outcomes)
                self.outbox.mark_published([envelope.id])
                self._delivered(envelope)
                delivered += 1
        return delivered

    def _prune(self, deps: Deps) -> None:
        """Retention on a bounded schedule: at most once per ``prune_interval_s``, a bounded
        delete of what is past its horizon (never on every transaction)."""
        now = deps.clock.now()
        if self._pruned_at is not None and now - self._pruned_at < deps.config.prune_interval_s:
            return
        self._pruned_at = now
        prune_expired(self._store, now, retention_s=deps.config.retention_s,
                      idempotency_s=deps.config.idempotency_window_s)

    def _deliver(self, envelope: Envelope, deps: Deps) -> tuple[dict[str, Outcome], str | None]:
        outcomes: dict[str, Outcome] = {}
        failure = None
        for service, handler in self._routes.subscribers(envelope.type):
            try:
                outcomes[service] = run_handler(service, handler, envelope, deps,
                                                report_unchanged=True)
            except Exception as exc:  # transient: the others still get it, this one retries
                log.warning("%s: %s %s failed, will retry: %s", service, envelope.type,
                            envelope.id, exc, extra={"service": service, **event_fields(envelope)})
                failure = f"{service}: {exc}"
        return outcomes, failure

    def _retry_later(self, envelope: Envelope, deps: Deps, failure: str) -> None:
        doc = envelope_to_doc(envelope)
        stored = self._store.read(OUTBOX, {"id": envelope.id})
        attempts = (stored[0].get("attempts", 0) if stored else 0) + 1
        if attempts >= MAX_DELIVERY_ATTEMPTS:
            deps.dead_letters.dead_letter(envelope, "bus", f"{attempts} attempts: {failure}")
            self.outbox.mark_published([envelope.id])
            self._delivered(envelope)
            return
        doc.update(attempts=attempts, last_error=failure)
        if stored:
            doc["seq"] = stored[0].get("seq", doc["seq"])
        self._store.write(OUTBOX, envelope.id, doc)


def _unchanged(outcomes: dict[str, Outcome]) -> bool:
    """Every subscriber saw nothing change (a report repeating the node's state): the event
    is state, not a change, and stays out of the timeline."""
    return bool(outcomes) and all(o is Outcome.UNCHANGED for o in outcomes.values())


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
        self._store.write(DEAD_LETTERS, outbox_doc_id(doc_id), doc)

    def list(self) -> list[dict[str, Any]]:
        return self._store.read(DEAD_LETTERS, {})
