"""The audit trail: who called what on which resource, and what the API answered.

Records carry ``expire_at`` (a TTL field on Firestore) and a ``time`` the embedded stores
index. ``shared.adapters.docstore.prune_expired`` prunes only the event log and idempotency
records, so ``AuditLog.prune`` prunes this collection itself.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any
from uuid import uuid4

from shared.ports import DocStore, Pruning, RangeReads

AUDIT_COLLECTION = "audit_log"


class AuditLog:
    """One document per API call in ``audit_log``, kept ``retention_s`` seconds."""

    def __init__(self, store: DocStore, retention_s: float) -> None:
        if retention_s <= 0:
            raise ValueError("retention_s must be positive")
        self._store = store
        self.retention_s = retention_s
        self._seq = itertools.count()

    def record(self, *, principal: str, permission: str, resource: str, method: str, status: int,
               now: float, reason: str = "") -> str:
        """Write one record; returns its id (unique even for calls in the same microsecond).
        ``reason``: why, for the commands that take one (an operator's, on a node)."""
        doc_id = f"{now:.6f}-{uuid4().hex[:8]}"
        doc = {"id": doc_id, "who": principal, "permission": permission, "resource": resource,
               "method": method, "status": status, "at": now, "time": now,
               "seq": next(self._seq), "expire_at": now + self.retention_s}
        if reason:
            doc["reason"] = reason
        self._store.write(AUDIT_COLLECTION, doc_id, doc)
        return doc_id

    def read(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Records with ``at >= since``, oldest first; from the store's time index if it has one."""
        if isinstance(self._store, RangeReads):
            return list(self._store.since(AUDIT_COLLECTION, since))
        docs = [d for d in self._store.read(AUDIT_COLLECTION, {}) if d["time"] >= since]
        return sorted(docs, key=lambda d: (d["time"], d.get("seq", 0)))

    def prune(self, now: float, limit: int = 5_000) -> int:
        """Delete up to ``limit`` records whose ``expire_at`` has passed; returns how many.

        Stores with an indexed ``prune`` (sqlite, memory) delete by ``time`` older than
        ``now - retention_s``; any other store is scanned by ``expire_at``. On Firestore a TTL
        policy on ``expire_at`` does it as well.
        """
        if isinstance(self._store, Pruning):
            return int(self._store.prune(AUDIT_COLLECTION, now - self.retention_s, limit))
        expired = [d for d in self._store.read(AUDIT_COLLECTION, {}) if d["expire_at"] < now]
        expired.sort(key=lambda d: d["expire_at"])
        for d in expired[:limit]:
            self._store.remove(AUDIT_COLLECTION, d["id"])
        return min(len(expired), limit)


class AnonymousBudget:
    """Calls no token identified are audited up to ``per_minute`` a minute; past that they
    are counted, and the next one recorded says how many were left out. An anonymous flood
    can neither fill the audit log nor push the identified callers' records out of it."""

    def __init__(self, per_minute: int = 60) -> None:
        self.per_minute = per_minute
        self._lock = threading.Lock()
        self._minute = -1
        self._admitted = 0
        self._skipped = 0

    def admit(self, now: float) -> int | None:
        """None: leave this call out; else how many were left out since the last admitted."""
        with self._lock:
            minute = int(now // 60)
            if minute != self._minute:
                self._minute, self._admitted = minute, 0
            if self._admitted >= self.per_minute:
                self._skipped += 1
                return None
            self._admitted += 1
            skipped, self._skipped = self._skipped, 0
            return skipped
