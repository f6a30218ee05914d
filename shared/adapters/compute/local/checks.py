"""LocalCompute's checks of a gang and of idle nodes: preflight and active checks.

- Preflight (``shared.ports.Preflight``): a real gloo all-reduce among one process per node
  of the gang (``preflight_gloo``); a node with an injected ``CollectiveBandwidthLow`` fault
  plays a slow link (its process pauses ``SLOW_LINK_S`` before every collective), one with an
  injected ``KnownAnswerMismatch`` computes wrong.
- Active checks (``shared.ports.ActiveChecks``): once per (node, key), completing at the next
  ``poll()`` after ``duration_s``: the known-answer compute test runs for real (on this CPU:
  the stand-in for the GPU's), wrong by one where a ``KnownAnswerMismatch`` fault is
  injected; the short DCGM diagnostic and the thermal read are the injected faults of those
  types, else left out of the report: a simulated node runs no dcgmi and has no sensor, and
  the report claims nothing it did not run (an ``unknown`` beside the agent's own ``false``
  would flip the node's condition at every report). A cancelled check reports nothing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.preflight_gloo import GlooPreflight
from shared.domain.events import NodeHealthReported
from shared.domain.health import ACTIVE_CHECK_SOURCE, Condition, ConditionType
from shared.policies.preflight import PreflightPlan, PreflightResult
from shared.probes import known_answer

CHECKS_SCHEMA = """
CREATE TABLE IF NOT EXISTS active_checks (
    node_id TEXT NOT NULL, key TEXT NOT NULL, started_at REAL NOT NULL,
    completes_at REAL NOT NULL, completed_at REAL, cancelled INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (node_id, key));
"""
SLOW_LINK_S = 0.3
# (shared.service_layer.active_checks.KEY: adapters do not import the service layer)
KEY = "active_check_key"
CTYPE = ConditionType


class LocalChecks:
    def __init__(self, store: FactStore, python: str, duration_s: float = 1.0) -> None:
        self._store = store
        self._duration_s = duration_s
        self.gloo = GlooPreflight(python, now=store.clock.now)

    def _injected(self, db: sqlite3.Connection, node_id: str) -> dict[str, Condition]:
        found: dict[str, Condition] = {}
        for row in db.execute("SELECT condition FROM faults WHERE node_id = ? ORDER BY id",
                              (node_id,)):
            cond = Condition.from_dict(json.loads(row["condition"]))
            found[cond.type] = cond
        return found

    def run_preflight(self, job_id: str, node_ids: Sequence[str], plan: PreflightPlan
                      ) -> PreflightResult:
        with self._store.tx() as db:
            faults = {n: self._injected(db, n) for n in node_ids}
        self.gloo.link_delay_s = {n: SLOW_LINK_S for n, f in faults.items()
                                  if CTYPE.COLLECTIVE_BANDWIDTH_LOW.value in f}
        self.gloo.corrupted = {n: 1 for n, f in faults.items()
                               if CTYPE.KNOWN_ANSWER_MISMATCH.value in f}
        return self.gloo.run_preflight(job_id, node_ids, plan)

    def start_active_check(self, node_id: str, key: str) -> None:
        now = self._store.clock.now()
        with self._store.tx() as db:
            db.execute("INSERT OR IGNORE INTO active_checks (node_id, key, started_at,"
                       " completes_at) VALUES (?, ?, ?, ?)",
                       (node_id, key, now, now + self._duration_s))

    def cancel_active_check(self, node_id: str, key: str) -> None:
        with self._store.tx() as db:
            db.execute("UPDATE active_checks SET cancelled = 1 WHERE node_id = ? AND key = ?",
                       (node_id, key))

    def observe(self, db: sqlite3.Connection, now: float) -> None:
        """Complete the checks due: one report each, queued with this poll's facts."""
        for row in db.execute("SELECT * FROM active_checks WHERE completed_at IS NULL AND"
                              " cancelled = 0 AND completes_at <= ? ORDER BY completes_at,"
                              " node_id", (now,)).fetchall():
            node_id, key = row["node_id"], row["key"]
            db.execute("UPDATE active_checks SET completed_at = ? WHERE node_id = ? AND"
                       " key = ?", (now, node_id, key))
            faults = self._injected(db, node_id)
            wrong = 1 if CTYPE.KNOWN_ANSWER_MISMATCH.value in faults else 0
            found = [known_answer.condition(known_answer.compute(corrupt_by=wrong), now,
                                            extra={KEY: key})]
            for ctype in (CTYPE.DCGM_DIAG_FAILED, CTYPE.THERMAL_THROTTLING):
                cond = faults.get(ctype.value)
                if cond is not None:  # (else not run: no dcgmi, no sensor; no claim either way)
                    found.append(Condition(cond.type, cond.status, cond.reason, now,
                                           {**cond.details, KEY: key}))
            self._store.queue(db, NodeHealthReported(
                node_id, now, tuple(c.to_dict() for c in found), source=ACTIVE_CHECK_SOURCE))
