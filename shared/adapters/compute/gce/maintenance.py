"""Planned maintenance on Compute Engine: ``resourceStatus.upcomingMaintenance`` as a condition,
and an instance the provider took away (a SPOT/FLEX_START preemption, a stop nobody asked for,
an instance gone) as a ``PreemptionNotice`` with no notice left.

Every ``watch_interval_s`` each running instance of ``GceCompute`` (with no task under way) is
read and its ``upcomingMaintenance`` turned into the ``UpcomingMaintenance`` condition, reported
on change only (conditions are state), with source ``compute-engine``: the cloud's notice,
which says nothing of the node's agent (no heartbeat). Triage maps a TRUE one to a reboot, so
the job checkpoints and moves before the window opens. The same report, forced, is the
post-repair check of what Compute Engine can vouch for.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.gce.api import Failure, GceApi, GceError
from shared.domain.events import NodeHealthReported
from shared.domain.health import COMPUTE_SOURCE, Condition, ConditionStatus, ConditionType

log = logging.getLogger("mtc.compute.gce")
MAINTENANCE = ConditionType.UPCOMING_MAINTENANCE.value
LOST = ConditionType.PREEMPTION_NOTICE.value
# instance states mtc did not ask for when no task is under way: the machine is not serving
_NOT_SERVING = frozenset({"STOPPING", "STOPPED", "TERMINATED", "SUSPENDING", "SUSPENDED"})


def migrate_lost(store: FactStore) -> None:
    """State written before the ``lost`` column existed gets it (empty: serving)."""
    with store.tx() as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(nodes)")}
        if "lost" not in columns:
            db.execute("ALTER TABLE nodes ADD COLUMN lost TEXT NOT NULL DEFAULT ''")


class MaintenanceWatch:
    """Held by ``GceCompute``, over its store (whose ``nodes`` table has ``maintenance``,
    ``lost`` and ``next_watch_at``) and its API."""

    def __init__(self, store: FactStore, api: GceApi, watch_interval_s: float) -> None:
        self._store = store
        self.api = api
        self.watch_interval_s = watch_interval_s

    def watch(self) -> None:
        """Read each running instance that is due and report what changed."""
        now = self._store.clock.now()
        with self._store.tx() as db:
            rows = db.execute(
                "SELECT n.* FROM nodes n WHERE n.provisioned = 1 AND n.deleted = 0"
                " AND n.next_watch_at <= ? AND NOT EXISTS (SELECT 1 FROM tasks t WHERE"
                " t.node_id = n.node_id AND t.status = 'active') ORDER BY n.node_id",
                (now,)).fetchall()
        for node in rows:
            try:
                inst = self.api.get(node["instance"])
            except GceError as exc:
                log.warning("cannot read %s: %s", node["instance"], exc)
                inst = None
                if exc.kind is not Failure.PERMANENT:
                    continue
            with self._store.tx() as db:
                db.execute("UPDATE nodes SET next_watch_at = ? WHERE node_id = ?",
                           (now + self.watch_interval_s, node["node_id"]))
                self._store.queue(db, self.lost(db, node["node_id"], inst, now))
                if inst is None:  # gone without being asked (a preemption, a person)
                    log.warning("instance %s of %s is gone", node["instance"], node["node_id"])
                    continue
                self._store.queue(db, self.report(db, node["node_id"], inst, now, COMPUTE_SOURCE))

    def lost(self, db: sqlite3.Connection, node_id: str, inst: Mapping[str, Any] | None,
              now: float) -> NodeHealthReported | None:
        """A machine the provider took away while no task of ours was under way is reported
        once as a ``PreemptionNotice`` with 0 s of notice (triage: checkpoint what can be,
        replace the node), and once FALSE when it serves again; None when nothing changed."""
        status = str((inst or {}).get("status") or "GONE")
        scheduling = (inst or {}).get("scheduling") or {}
        lost = status if inst is None or status in _NOT_SERVING else ""
        row = db.execute("SELECT lost FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        if row is None or row["lost"] == lost:
            return None
        db.execute("UPDATE nodes SET lost = ? WHERE node_id = ?", (lost, node_id))
        if not lost:
            cond = Condition(LOST, ConditionStatus.FALSE, "the instance is running again", now)
        else:
            model = str(scheduling.get("provisioningModel") or "STANDARD")
            kind = ("preempted" if model in ("SPOT", "FLEX_START") or scheduling.get("preemptible")
                    else "gone" if inst is None else "stopped")
            cond = Condition(LOST, ConditionStatus.TRUE,
                             f"instance {status.lower()} without being asked ({kind}, {model})",
                             now, {"notice_s": 0.0, "kind": kind, "instance_status": status})
        return NodeHealthReported(node_id, now, (cond.to_dict(),), source=COMPUTE_SOURCE)

    def report(self, db: sqlite3.Connection, node_id: str, inst: Mapping[str, Any] | None,
                now: float, source: str, *, force: bool = False) -> NodeHealthReported | None:
        """The ``UpcomingMaintenance`` condition of the instance; None when it did not change
        (unless ``force``: a post-repair check always reports)."""
        upcoming = ((inst or {}).get("resourceStatus") or {}).get("upcomingMaintenance") or {}
        status = str(upcoming.get("maintenanceStatus") or "")
        pending = bool(upcoming) and status != "UNKNOWN"
        state = json.dumps(upcoming, sort_keys=True) if pending else ""
        row = db.execute("SELECT maintenance FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        if row is None or (row["maintenance"] == state and not force):
            return None
        db.execute("UPDATE nodes SET maintenance = ? WHERE node_id = ?", (state, node_id))
        if pending:
            window = upcoming.get("windowStartTime") or upcoming.get("latestWindowStartTime") or ""
            cond = Condition(MAINTENANCE, ConditionStatus.TRUE,
                             f"{upcoming.get('type', 'SCHEDULED')} maintenance {status.lower()}"
                             f" from {window or 'soon'}", now,
                             {"type": upcoming.get("type", ""), "window_start": window,
                              "window_end": upcoming.get("windowEndTime", ""),
                              "maintenance_status": status,
                              "can_reschedule": bool(upcoming.get("canReschedule", False))})
        else:
            cond = Condition(MAINTENANCE, ConditionStatus.FALSE,
                             "no maintenance scheduled for the instance", now)
        return NodeHealthReported(node_id, now, (cond.to_dict(),), source=source)

