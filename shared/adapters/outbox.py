"""The one outbox: how an event becomes an envelope, waits in the store, and is published.

Every unit of work writes what it emitted to the ``outbox`` collection in its own transaction
(``DocUnitOfWork.commit``); ``publish_all`` (shared.handling) removes an entry once the
publisher has it; the sweeper republishes what a crash left between the two. The embedded bus
uses the same collection as its queue. Compute adapters and agents, which publish outside any
transaction, get a ``SourceEmitter``: an ``Emitter`` bound to their CloudEvent source.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from shared.domain.events import Envelope, Event, event_class
from shared.ports import Claiming, Clock, DocStore, Emitter, Publisher

log = logging.getLogger("mtc.outbox")

OUTBOX = "outbox"

_counter = iter(range(1, 1 << 62))


def doc_id(key: str) -> str:
    """Firestore ids cannot contain '/', so keys are hashed."""
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def make_envelope(event: Event, source: str, now: float, *, seed: str | None = None) -> Envelope:
    """``seed`` (the cause's key) makes the id stable, so a re-run emits the same event."""
    event_id = doc_id(seed) if seed else uuid.uuid4().hex
    return Envelope(event=event, id=event_id, source=source, time=now)


def envelope_to_doc(env: Envelope) -> dict[str, Any]:
    return {
        "id": env.id,
        "source": env.source,
        "type": env.type,
        "time": env.time,
        "subject": env.event.subject,
        "data": env.event.to_dict(),
        "seq": next(_counter),
    }


def envelope_from_doc(doc: dict[str, Any]) -> Envelope:
    cls = event_class(doc["type"])
    return Envelope(event=cls.from_dict(doc["data"]), id=doc["id"], source=doc["source"],
                    time=doc["time"])


class DocOutbox:
    """The ``Outbox`` port over any document store: oldest first, removed once published."""

    def __init__(self, store: DocStore) -> None:
        self._store = store

    def pending(self, limit: int = 100) -> list[Envelope]:
        return [envelope_from_doc(d) for d in self._store.oldest(OUTBOX, limit)]

    def put(self, envelope: Envelope) -> None:
        """Queue an envelope outside any transaction (the embedded bus's inject)."""
        self._store.write(OUTBOX, envelope.id, envelope_to_doc(envelope))

    def mark_published(self, ids: Sequence[str]) -> None:
        for event_id in ids:
            self._store.remove(OUTBOX, event_id)


def sweep_outbox(store: DocStore, publisher: Publisher, *, min_age_s: float = 0.0,
                 now: float | None = None, limit: int = 500, lease_s: float = 30.0) -> int:
    """Publish what a crash between commit and publish left in the outbox; return how many.

    Only entries older than ``min_age_s`` are taken, so a sweep does not race the publish
    that normally follows a commit within milliseconds. Where the store offers ``claim``
    (Firestore), each entry is claimed first (optimistic concurrency on its update time), so
    two sweepers do not both publish it; a duplicate would be harmless anyway, since every
    handler is idempotent on the CloudEvent source + id, which a republish keeps."""
    now = time.time() if now is None else now
    outbox = DocOutbox(store)
    claiming = store if isinstance(store, Claiming) else None
    published = 0
    for envelope in outbox.pending(limit):
        if envelope.time > now - min_age_s:
            break  # pending() is ordered by time: the rest are younger still
        if claiming is not None and not claiming.claim(
                OUTBOX, envelope.id, field="claimed_until", now=now, until=now + lease_s):
            continue
        publisher.publish(envelope)
        outbox.mark_published([envelope.id])
        published += 1
    if published:
        log.info("outbox sweeper republished %d event(s)", published)
    return published


def leave_in_outbox(store: DocStore, envelope: Envelope) -> None:
    """Put an envelope in the outbox without publishing it (tools, tests)."""
    DocOutbox(store).put(envelope)


class SourceEmitter:
    """The ``Emitter`` port: events from outside a transaction, stamped with one source.

    ``sink`` takes the envelope (the embedded bus's queue, a Pub/Sub publisher); ``source_for``
    may name a more specific source per event (a node agent's report keeps the agent's)."""

    def __init__(self, sink: Callable[[Envelope], None], clock: Clock, source: str, *,
                 source_for: Callable[[Event], str | None] | None = None) -> None:
        self._sink = sink
        self._clock = clock
        self.source = source
        self._source_for = source_for

    def __call__(self, event: Event) -> None:
        source = (self._source_for(event) if self._source_for else None) or self.source
        self._sink(make_envelope(event, source, self._clock.now()))


# ------------------------------------------------------------------ the sqlite fact outbox
# The same outbox for a process that keeps its own sqlite state instead of a document store
# (the compute adapters: shared.adapters.compute.fact_store). A fact is queued in the
# transaction that records it and emitted after commit, so a crash between the two emits it
# on the next drain, and a fact is emitted once however many processes drain in turn.

FACT_OUTBOX_LEASE_S = 30.0  # a claimed fact not emitted by then (its drainer died) goes again
FACT_OUTBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL, data TEXT NOT NULL,
    claimed_at REAL);
"""


class SqliteFactOutbox:
    """Facts waiting in a sqlite ``outbox`` table, emitted in order through an ``Emitter``.

    ``transaction`` opens one write transaction on the owner's database (BEGIN IMMEDIATE, so
    processes taking turns never interleave); ``queue`` runs inside the owner's own one."""

    def __init__(self, transaction: Callable[[], AbstractContextManager[sqlite3.Connection]],
                 emit: Emitter, clock: Clock, *, lease_s: float = FACT_OUTBOX_LEASE_S) -> None:
        self._tx = transaction
        self._emit = emit
        self._clock = clock
        self._lease_s = lease_s

    @staticmethod
    def queue(db: sqlite3.Connection, event: Event) -> None:
        db.execute("INSERT INTO outbox (type, data) VALUES (?, ?)",
                   (event.TYPE, json.dumps(event.to_dict())))

    def drain(self) -> None:
        """Emit queued facts in order, outside any transaction; delete each once emitted. An
        ``emit`` that raises leaves its fact (and the rest) for the next drain."""
        while True:
            now = self._clock.now()
            with self._tx() as db:
                row = db.execute(
                    "SELECT id, type, data FROM outbox WHERE claimed_at IS NULL OR claimed_at <= ?"
                    " ORDER BY id LIMIT 1",
                    (now - self._lease_s,),
                ).fetchone()
                if row is not None:
                    db.execute("UPDATE outbox SET claimed_at = ? WHERE id = ?", (now, row[0]))
            if row is None:
                return
            fact_id, fact_type, data = row[0], row[1], row[2]
            event = event_class(fact_type).from_dict(json.loads(data))
            try:
                self._emit(event)
            except BaseException:
                with self._tx() as db:
                    db.execute("UPDATE outbox SET claimed_at = NULL WHERE id = ?", (fact_id,))
                raise
            with self._tx() as db:
                db.execute("DELETE FROM outbox WHERE id = ?", (fact_id,))
