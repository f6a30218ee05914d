"""LocalCompute's simulated nodes: provisioning, injected faults, repairs, heartbeats.

A node is a row in the adapter's sqlite file. Faults stay until a repair that truly fixes
them (``faults``); a repair runs once per (node, attempt) and completes once (the
shared ledger), followed by a post-repair report of every condition; a provisioned node
reports its conditions every ``agent_interval_s`` as its agent would.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.ledger import repair_completed
from shared.adapters.compute.local.faults import clears, merge, required_action
from shared.domain.events import NodeHealthReported, NodeProvisioned
from shared.domain.health import Condition, ConditionStatus, ConditionType, RepairAction
from shared.domain.model import Node

RA = RepairAction
HEALTHY_REASON = "simulated local node: no fault injected"
DEFAULT_REPAIR_DURATIONS_S: Mapping[RepairAction, float] = {
    RA.NONE: 0.0,
    RA.RESTART_JOB: 0.0,
    RA.RESET_GPU: 0.5,
    RA.REBOOT: 1.0,
    RA.REIMAGE: 2.0,
    RA.REPLACE: 2.0,
}

NODES_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY, data TEXT NOT NULL, requested_at REAL NOT NULL,
    ready_at REAL NOT NULL, provisioned INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0, next_heartbeat_at REAL,
    healthy_since REAL NOT NULL, cleared TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT, node_id TEXT NOT NULL, condition TEXT NOT NULL,
    needs TEXT NOT NULL, injected_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS repairs (
    node_id TEXT NOT NULL, attempt INTEGER NOT NULL, action TEXT NOT NULL,
    started_at REAL NOT NULL, completes_at REAL, completed_at REAL,
    PRIMARY KEY (node_id, attempt));
CREATE TABLE IF NOT EXISTS deep_checks (
    node_id TEXT NOT NULL, attempt INTEGER NOT NULL, started_at REAL NOT NULL,
    completes_at REAL NOT NULL, completed_at REAL, PRIMARY KEY (node_id, attempt));
"""
DEEP_CHECK_TYPES = (ConditionType.DCGM_DIAG_FAILED.value,
                    ConditionType.COLLECTIVE_BANDWIDTH_LOW.value)
NO_DEEP_TOOLS = "simulated local node: dcgmi and all_reduce_perf are not run on it"


@dataclass(frozen=True)
class NodeSettings:
    """How long the simulated machines take, and how often their agents report."""

    repair_durations_s: Mapping[RepairAction, float]
    provision_duration_s: float
    agent_interval_s: float
    deep_check_duration_s: float


class LocalNodes:
    """The node half of ``LocalCompute``, held by it: the port's node calls, fault
    injection, and what ``poll()`` completes (``observe``)."""

    def __init__(self, settings: NodeSettings, store: FactStore) -> None:
        self._settings = settings
        self._store = store

    def provision_node(self, node: Node) -> None:
        """Record the node; ``poll()`` reports it up after ``provision_duration_s``."""
        now = self._store.clock.now()
        with self._store.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO nodes (node_id, data, requested_at, ready_at, healthy_since)"
                " VALUES (?, ?, ?, ?, ?)",
                (node.node_id, json.dumps(node.to_dict()), now,
                 now + self._settings.provision_duration_s, now),
            )

    def cordon(self, node_id: str, reason: str) -> None:
        """Local nodes take work only as the control plane assigns it: nothing to fence."""

    def uncordon(self, node_id: str) -> None:
        """See cordon."""

    def delete_node(self, node_id: str) -> None:
        """Forget the node: no more heartbeats, repairs or reports."""
        with self._store.tx() as db:
            db.execute("UPDATE nodes SET deleted = 1 WHERE node_id = ?", (node_id,))

    def inject_fault(self, node_id: str, conditions: Sequence[Condition]) -> None:
        """Break a simulated node: keep its faults and report them at once (``mtc node
        fault``). Conditions with status ``false`` are reported but there is nothing to keep."""
        now = self._store.clock.now()
        needs = [required_action(c) for c in conditions]  # ValueError on a bad clears_with
        with self._store.tx() as db:
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            if node is None or node["deleted"]:
                raise LookupError(f"no such node: {node_id!r}")
            transient: list[Condition] = []
            for cond, need in zip(conditions, needs, strict=True):
                if cond.status is ConditionStatus.FALSE:
                    continue
                if need is RA.NONE:
                    transient.append(cond)
                    continue
                db.execute(
                    "INSERT INTO faults (node_id, condition, needs, injected_at) VALUES (?,?,?,?)",
                    (node_id, json.dumps(cond.to_dict()), need.value, now),
                )
            report = self._snapshot(db, node, transient)
            self._store.queue(db, NodeHealthReported(node_id, now, report, source="agent"))
        self._store.drain()

    def node_faults(self, node_id: str) -> list[tuple[Condition, RepairAction]]:
        """Faults the node still has, each with the cheapest repair that clears it."""
        with self._store.tx() as db:
            rows = db.execute(
                "SELECT condition, needs FROM faults WHERE node_id = ? ORDER BY id", (node_id,)
            ).fetchall()
        return [(Condition.from_dict(json.loads(r["condition"])), RA(r["needs"])) for r in rows]

    def _snapshot(
        self, db: sqlite3.Connection, node: sqlite3.Row, extra: Sequence[Condition] = ()
    ) -> tuple[dict[str, Any], ...]:
        """Every condition type, faults as injected and the rest ``false``: what an agent
        that ran all its checks would report."""
        faults = [
            Condition.from_dict(json.loads(r["condition"]))
            for r in db.execute(
                "SELECT condition FROM faults WHERE node_id = ? ORDER BY id", (node["node_id"],)
            )
        ]
        by_type: dict[str, Condition] = {}
        for cond in [*faults, *extra]:
            prev = by_type.get(cond.type)
            by_type[cond.type] = cond if prev is None else merge(prev, cond)
        cleared: dict[str, list[Any]] = json.loads(node["cleared"])
        out: list[dict[str, Any]] = []
        for ctype in ConditionType:
            if ctype.value in by_type:
                out.append(by_type.pop(ctype.value).to_dict())
                continue
            since, reason = cleared.get(ctype.value, (node["healthy_since"], HEALTHY_REASON))
            out.append(Condition(ctype.value, ConditionStatus.FALSE, reason, since).to_dict())
        out.extend(c.to_dict() for c in by_type.values())  # types this version does not know
        return tuple(out)

    # ------------------------------------------------------------ repairs

    def stage_software(self, node_id: str, version: Mapping[str, str]) -> None:
        """``SoftwareImages``, simulated: the version the next reimage writes is recorded in
        the node's record (``staged_software``); no image exists to write."""
        with self._store.tx() as db:
            db.execute("UPDATE nodes SET data = json_set(data, '$.staged_software', json(?))"
                       " WHERE node_id = ?", (json.dumps(dict(version)), node_id))

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> bool:
        """Start a repair once per (node, attempt); a repeat, even with another action, is a
        no-op (False). MANUAL never completes by itself."""
        action = RA(action)
        now = self._store.clock.now()
        duration = self._settings.repair_durations_s.get(action, 0.0)
        completes_at = None if action is RA.MANUAL else now + duration
        with self._store.tx() as db:
            return self._store.ledger(db).start_repair(node_id, attempt, action.value, now,
                                                       completes_at=completes_at)

    def _complete_repairs(self, db: sqlite3.Connection, now: float) -> None:
        due = db.execute(
            "SELECT * FROM repairs WHERE completed_at IS NULL AND completes_at <= ?"
            " ORDER BY completes_at, node_id, attempt",
            (now,),
        ).fetchall()
        ledger = self._store.ledger(db)
        for rep in due:
            node_id, attempt, action = rep["node_id"], rep["attempt"], RA(rep["action"])
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            if node is None or node["deleted"]:
                done = repair_completed(ledger, node_id, attempt, action.value, False,
                                        "unknown node", now)
                self._store.queue(db, done if node is None else None)
                continue
            faults = [
                (f["id"], json.loads(f["condition"])["type"], clears(action, RA(f["needs"])))
                for f in db.execute(
                    "SELECT id, condition, needs FROM faults WHERE node_id = ?", (node_id,)
                )
            ]
            fixed = [(fid, ctype) for fid, ctype, fixes in faults if fixes]
            remaining_types = {ctype for _, ctype, fixes in faults if not fixes}
            cleared = json.loads(node["cleared"])
            for fid, ctype in fixed:
                db.execute("DELETE FROM faults WHERE id = ?", (fid,))
                if ctype not in remaining_types:
                    cleared[ctype] = [now, f"cleared by {action.value}"]
            db.execute(
                "UPDATE nodes SET cleared = ? WHERE node_id = ?", (json.dumps(cleared), node_id)
            )
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            detail = f"cleared {len(fixed)} fault(s), {len(faults) - len(fixed)} remain"
            self._store.queue(db, repair_completed(ledger, node_id, attempt, action.value, True,
                                             detail, now))
            report = self._snapshot(db, node)
            self._store.queue(db, NodeHealthReported(node_id, now, report, source="post-repair-check"))


    # ------------------------------------------------------------ deep checks

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """Deep checks once per (node, attempt), completing after ``deep_check_duration_s``.
        A simulated node runs no GPU tools: a check reports the fault injected for it
        (``mtc node fault --dcgm-level 3``) or ``unknown``, never a pass it did not run."""
        now = self._store.clock.now()
        with self._store.tx() as db:
            db.execute("INSERT OR IGNORE INTO deep_checks (node_id, attempt, started_at,"
                       " completes_at) VALUES (?, ?, ?, ?)",
                       (node_id, attempt, now, now + self._settings.deep_check_duration_s))

    def _complete_deep_checks(self, db: sqlite3.Connection, now: float) -> None:
        for row in db.execute("SELECT * FROM deep_checks WHERE completed_at IS NULL AND"
                              " completes_at <= ? ORDER BY completes_at, node_id, attempt",
                              (now,)).fetchall():
            node_id, attempt = row["node_id"], row["attempt"]
            db.execute("UPDATE deep_checks SET completed_at = ? WHERE node_id = ? AND"
                       " attempt = ?", (now, node_id, attempt))
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            if node is None or node["deleted"]:
                continue
            injected: dict[str, Condition] = {}
            for fault in db.execute("SELECT condition FROM faults WHERE node_id = ? ORDER BY id",
                                    (node_id,)):
                cond = Condition.from_dict(json.loads(fault["condition"]))
                if cond.type in DEEP_CHECK_TYPES:
                    injected[cond.type] = cond
            conditions = []
            for ctype in DEEP_CHECK_TYPES:
                cond = injected.get(ctype) or Condition(ctype, ConditionStatus.UNKNOWN,
                                                        NO_DEEP_TOOLS, now)
                details = {**cond.details, "deep_check_attempt": attempt}
                conditions.append(Condition(cond.type, cond.status, cond.reason, now,
                                            details).to_dict())
            self._store.queue(db, NodeHealthReported(node_id, now, tuple(conditions),
                                               source="deep-check"))

    def _complete_provisioning(self, db: sqlite3.Connection, now: float) -> None:
        for node in db.execute(
            "SELECT * FROM nodes WHERE provisioned = 0 AND deleted = 0 AND ready_at <= ?"
            " ORDER BY ready_at, node_id",
            (now,),
        ).fetchall():
            db.execute(
                "UPDATE nodes SET provisioned = 1, healthy_since = ?, next_heartbeat_at = ?"
                " WHERE node_id = ?",
                (now, now + self._settings.agent_interval_s, node["node_id"]),
            )
            self._store.queue(db, NodeProvisioned(node["node_id"], True, "simulated local node"))
            node = db.execute(
                "SELECT * FROM nodes WHERE node_id = ?", (node["node_id"],)
            ).fetchone()
            self._store.queue(db, NodeHealthReported(node["node_id"], now, self._snapshot(db, node)))

    def send_heartbeats(self, db: sqlite3.Connection, now: float) -> None:
        interval = max(self._settings.agent_interval_s, 0.0)  # 0: a heartbeat on every poll
        for node in db.execute(
            "SELECT * FROM nodes WHERE provisioned = 1 AND deleted = 0 AND next_heartbeat_at <= ?"
            " ORDER BY node_id",
            (now,),
        ).fetchall():
            db.execute(
                "UPDATE nodes SET next_heartbeat_at = ? WHERE node_id = ?",
                (now + interval, node["node_id"]),
            )
            self._store.queue(db, NodeHealthReported(node["node_id"], now, self._snapshot(db, node)))


    def observe(self, db: sqlite3.Connection, now: float) -> None:
        """What completed since the last poll: provisioning, repairs, deep checks."""
        self._complete_provisioning(db, now)
        self._complete_repairs(db, now)
        self._complete_deep_checks(db, now)
