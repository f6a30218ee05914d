"""The event log: every delivered event in the store's ``events`` collection, for the
timeline and goodput, and an incremental reader of it (split out of ``docstore``, which
re-exports both)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shared.adapters.outbox import doc_id as _doc_id
from shared.adapters.outbox import envelope_to_doc
from shared.domain.events import Envelope
from shared.ports import DocStore, Publisher, RangeReads

EVENTS = "events"
DELIVERED = "delivered"
# reports and ticks arrive all the time; they enter the log only when handling them changed
# something (``log_delivery``), as the embedded bus does
ROUTINE_TYPES = frozenset({"mtc.node.health_reported.v1", "mtc.fleet.ticked.v1"})
DEFAULT_RETENTION_S = 7 * 24 * 3600.0  # ControlPlaneConfig's default, when none is at hand
FOLLOW_LOOKBACK_S = 60.0  # an incremental reader re-reads this much: late deliveries


class DocEventLog:
    """Every delivered event, for the timeline and goodput. Each entry carries ``expire_at``
    (its retention horizon: a TTL field on Firestore) and is pruned by ``prune_expired``."""

    def __init__(self, store: DocStore, *, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self._store = store
        self._ranged = store if isinstance(store, RangeReads) else None  # a time index
        self._seq = 0
        self.retention_s = retention_s

    def append(self, envelope: Envelope, outcome: str, detail: str = "") -> None:
        self._seq += 1
        doc = envelope_to_doc(envelope)
        doc.update(outcome=outcome, detail=detail, expire_at=envelope.time + self.retention_s)
        key = f"{envelope.key}|{outcome}|{detail}"
        self._store.write(EVENTS, _doc_id(key), doc)

    def read(self, since: float = 0.0) -> Iterator[dict[str, Any]]:
        """Entries with ``time >= since`` in (time, seq) order, from the store's time index
        where it has one (no full read)."""
        if self._ranged is not None:
            yield from self._ranged.since(EVENTS, since)
            return
        docs = self._store.read(EVENTS, {})
        yield from sorted((d for d in docs if d["time"] >= since),
                          key=lambda d: (d["time"], d.get("seq", 0)))


class EventCursor:
    """Reads an event log incrementally (``mtc events --follow``): each ``next()`` returns
    only events not returned before (one entry per event), reading from the last time seen minus a look-back
    window (an event is logged with its own time, so a late delivery lands behind the
    cursor), never the whole log."""

    def __init__(self, log: DocEventLog, since: float = 0.0,
                 lookback_s: float = FOLLOW_LOOKBACK_S) -> None:
        self._log = log
        self._time = since
        self._lookback = lookback_s
        self._seen: dict[str, float] = {}  # envelope id -> its time, within the look-back

    def next(self) -> list[dict[str, Any]]:
        start = max(0.0, self._time - self._lookback) if self._seen else self._time
        out = []
        for doc in self._log.read(start):
            if doc["id"] in self._seen:
                continue  # printed already (a redelivery logs the same event again)
            self._seen[doc["id"]] = doc["time"]
            out.append(doc)
            self._time = max(self._time, doc["time"])
        horizon = self._time - self._lookback
        self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
        return out


def log_delivery(log: DocEventLog, envelope: Envelope) -> None:
    """An event a function handled and that changed something, in the log. One entry per
    event whichever function handled it and however often it was delivered (the entry's id
    is the event's key), so a cloud deployment's log matches the embedded one's."""
    log.append(envelope, DELIVERED)


class LoggingPublisher:
    """Publishes, then logs what it published: in the cloud no bus delivers in process, so
    the event log (timelines, goodput, the event-derived metrics) is kept where events leave
    the control plane. Routine types are left to ``log_delivery``."""

    def __init__(self, inner: Publisher, log: DocEventLog) -> None:
        self._inner = inner
        self._log = log

    def publish(self, envelope: Envelope) -> None:
        self._inner.publish(envelope)
        if envelope.type not in ROUTINE_TYPES:
            log_delivery(self._log, envelope)
