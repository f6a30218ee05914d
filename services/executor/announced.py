"""The executor's record of the attempt facts it published, until the store has them.

Every envelope of a kind the reconciler watches (``shared.policies.reconcile.KINDS``: an
attempt's exit, its first step) is written here before it is published, whole (its
CloudEvent id, source and time included), so the reconciler can publish the very same
envelope again. A record is dropped as soon as the store shows the fact recorded or no
longer needed, so the file holds only what is in flight or lost; ``max_records`` bounds it
anyway (the oldest go first).

A sqlite file in the executor's state directory (WAL, synchronous FULL): a record written
before a crash is still there after it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from services.executor.bounded import BoundedTable
from shared.adapters.outbox import envelope_from_doc, envelope_to_doc
from shared.domain.events import Envelope
from shared.policies.reconcile import KINDS, Announced

_SCHEMA = """
CREATE TABLE IF NOT EXISTS announced (
    event_id TEXT PRIMARY KEY, kind TEXT NOT NULL, job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL, announced_at REAL NOT NULL, sends INTEGER NOT NULL,
    last_sent REAL NOT NULL, envelope TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS announced_at ON announced (announced_at);
"""


class AnnouncedRecord:
    """``note``/``facts``/``envelope``/``sent``/``forget`` over
    ``<state_dir>/announced.sqlite3``."""

    FILE = "announced.sqlite3"

    def __init__(self, state_dir: Path, *, max_records: int = 50_000) -> None:
        self._t = BoundedTable(state_dir, self.FILE, _SCHEMA, table="announced",
                               key="event_id", order="announced_at", max_records=max_records)
        self.path = self._t.path
        self.max_records = max_records

    def note(self, envelope: Envelope) -> bool:
        """Keep ``envelope`` if it is an attempt fact the reconciler watches; True if kept."""
        data = envelope.event.to_dict()
        if envelope.type not in KINDS or "job_id" not in data or "attempt" not in data:
            return False
        doc = envelope_to_doc(envelope)
        doc.pop("seq", None)
        self._t.change(
            "INSERT OR IGNORE INTO announced (event_id, kind, job_id, attempt, "
            "announced_at, sends, last_sent, envelope) VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
            (envelope.id, envelope.type, str(data["job_id"]), int(data["attempt"]),
             envelope.time, envelope.time, json.dumps(doc)))
        return True

    def facts(self, before: float, limit: int) -> list[Announced]:
        """At most ``limit`` records announced before ``before``, oldest first."""
        rows = self._t.rows(
            "SELECT event_id, kind, job_id, attempt, announced_at, sends, last_sent"
            " FROM announced WHERE announced_at <= ? ORDER BY announced_at, event_id"
            " LIMIT ?", (before, limit))
        return [Announced(r[0], r[1], r[2], int(r[3]), float(r[4]), int(r[5]), float(r[6]))
                for r in rows]

    def envelope(self, event_id: str) -> Envelope | None:
        rows = self._t.rows("SELECT envelope FROM announced WHERE event_id = ?", (event_id,))
        return envelope_from_doc(json.loads(rows[0][0])) if rows else None

    def sent(self, event_id: str, now: float) -> None:
        self._t.change("UPDATE announced SET sends = sends + 1, last_sent = ?"
                       " WHERE event_id = ?", (now, event_id))

    def forget(self, event_ids: Iterable[str]) -> int:
        ids = [(i,) for i in event_ids]
        self._t.change_many("DELETE FROM announced WHERE event_id = ?", ids)
        self._t.trim()
        return len(ids)

    def __len__(self) -> int:
        return len(self._t)

    def close(self) -> None:
        self._t.close()


class Recording:
    """A publish that notes each attempt fact in ``record`` first, then publishes it: a
    crash in between leaves a record of a fact never sent, which the reconciler sends."""

    def __init__(self, publish: Callable[[Envelope], None], record: AnnouncedRecord) -> None:
        self._publish = publish
        self.record = record

    def __call__(self, envelope: Envelope) -> None:
        self.record.note(envelope)
        self._publish(envelope)
