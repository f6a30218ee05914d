"""The Slurm adapter's drains: mtc undoes only the drains it made, and notices the others.

A Slurm node's DRAIN has one ``Reason``, and whoever drains it last sets it. mtc writes its
own reasons with the prefix ``mtc:`` (``api.drain_reason``; the node agent's
HealthCheckProgram writes ``mtc-agent ...``) and records each drain it made (``nodes.mtc_drain``,
``drained_at``). From that:

* ``drain`` of a node someone else drained leaves their reason in place (it is drained
  already; overwriting the reason would make their drain look like mtc's);
* ``resume`` (``uncordon``, ``delete_node``) only resumes a node whose *current* reason is
  mtc's own: a node an operator drained for their own reason (a bad fan, maintenance) stays
  drained, as NHC does (https://github.com/mej/nhc/issues/134);
* ``poll()`` reports a node drained with a foreign reason as a ``NodeHealthReported`` from
  source ``operator`` with a TRUE ``DrainedByOperator`` condition carrying the reason (and
  FALSE once the drain is lifted); every agent report of the node carries it meanwhile, so
  the control plane can keep the node out of service and never count it healthy;
* ``poll()`` notices when an operator resumed a node that mtc drained and still holds out of
  service (a cordon mtc did not lift): it reports a TRUE ``ResumedByOperator`` condition,
  raises an ``operator-resume`` alert and drains the node again, the safe default while mtc
  considers the node unhealthy (the control plane may accept it with ``uncordon``).

The reason is read right before ``scontrol update state=resume``; an operator who drains the
node in the moment between the two is not seen (Slurm has no compare-and-set for node state).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.slurm.api import (
    RESUMED_BY_OPERATOR,
    NodeRecord,
    SlurmApi,
    foreign_reason,
    operator_condition,
)
from shared.adapters.compute.slurm.cli import SlurmPermanentError
from shared.adapters.compute.slurm.ops import OpQueue, OpResult, log
from shared.adapters.compute.slurm.view import SlurmView
from shared.domain.events import NodeHealthReported

DRAIN_COLUMNS = {"mtc_drain": "TEXT", "drained_at": "REAL", "foreign_reason": "TEXT",
                 "foreign_since": "REAL"}


def migrate_drains(store: FactStore) -> None:
    """Add the drain-ownership columns to a state file from before them."""
    with store.tx() as db:
        cols = {r["name"] for r in db.execute("PRAGMA table_info(nodes)")}
        for name, kind in DRAIN_COLUMNS.items():
            if name not in cols:
                db.execute(f"ALTER TABLE nodes ADD COLUMN {name} {kind}")


class SlurmDrains:
    """Drains and resumes that respect other people's drains: the ``drain`` and ``resume``
    operations, and what ``poll()`` notices of other people's drains and resumes."""

    def __init__(self, store: FactStore, view: SlurmView, cli: SlurmApi, ops: OpQueue) -> None:
        self._store = store
        self._view = view
        self._cli = cli
        self._ops = ops
        ops.register("drain", self._op_drain, self._done_drain)
        ops.register("resume", self._op_resume, self._done_resume)

    def _record_of(self, node: str) -> NodeRecord | None:
        return next((r for r in self._cli.node_records() if r.name == node), None)

    def _op_drain(self, args: dict[str, Any]) -> OpResult:
        foreign = foreign_reason(self._record_of(args["node"]))
        if foreign is not None:
            log.warning("%s is drained by someone else (%s): their reason is kept", args["node"], foreign)
            return OpResult(True, data={"foreign": foreign})
        self._cli.drain(args["node"], args["reason"])
        return OpResult(True, data={"reason": args["reason"]})

    def _done_drain(self, db: sqlite3.Connection, args: dict[str, Any], data: dict[str, Any],
                    now: float) -> None:
        if "reason" in data:
            db.execute("UPDATE nodes SET mtc_drain = ?, drained_at = ? WHERE slurm_node = ?",
                       (data["reason"], now, args["node"]))

    def _op_resume(self, args: dict[str, Any]) -> OpResult:
        foreign = foreign_reason(self._record_of(args["node"]))
        if foreign is not None:
            return OpResult(True, data={"foreign": foreign})
        try:
            self._cli.resume(args["node"])
        except SlurmPermanentError as exc:
            if "invalid node state" not in str(exc).lower():
                raise
            # not drained (any more): already in service, which is what we want
        return OpResult(True)

    def _done_resume(self, db: sqlite3.Connection, args: dict[str, Any], data: dict[str, Any],
                     now: float) -> None:
        db.execute("UPDATE nodes SET mtc_drain = NULL, drained_at = NULL WHERE slurm_node = ?",
                   (args["node"],))
        if "foreign" in data:
            self._ops.alert(db, "foreign-drain-kept", args["node"],
                        f"not resumed: drained by someone else ({data['foreign']})")

    def observe(self, db: sqlite3.Connection, now: float) -> list[str]:
        """Report drains made by others, and resumes of mtc's drains made by others (then
        drain again); returns operation keys to run."""
        keys: list[str] = []
        busy = {r["node_id"] for r in db.execute("SELECT node_id FROM repairs WHERE completed_at IS NULL")}
        pending = {r["key"] for r in db.execute(
            "SELECT key FROM ops WHERE key LIKE 'state:%' AND status IN ('pending', 'running')")}
        for row in db.execute(
            "SELECT * FROM nodes WHERE role = 'worker' AND deleted = 0 AND slurm_node IS NOT NULL"
            " ORDER BY node_id"
        ).fetchall():
            node_id, slurm_node = row["node_id"], row["slurm_node"]
            record = self._view.records.get(slurm_node)
            if record is None:
                continue
            foreign = foreign_reason(record)
            if foreign != row["foreign_reason"]:
                db.execute("UPDATE nodes SET foreign_reason = ?, foreign_since = ? WHERE node_id = ?",
                           (foreign, now if foreign is not None else None, node_id))
                condition = operator_condition(slurm_node, foreign, now)
                self._store.queue(db, NodeHealthReported(node_id, now, (condition,), source="operator"))
                if foreign is not None:
                    self._ops.alert(db, "operator-drain", node_id, condition["reason"])
            resumed = (
                row["mtc_drain"] is not None
                and row["cordon"] is not None
                and row["drained_at"] is not None
                and self._view.observed_at > row["drained_at"]  # a view taken after mtc's drain
                and record.up
                and not record.rebooting
                and not record.node.drained
                and node_id not in busy
                and f"state:{slurm_node}" not in pending
            )
            if not resumed:
                continue
            text = (f"Slurm node {slurm_node} resumed by an operator while mtc holds it drained"
                    f" ({row['mtc_drain']}); drained again")
            condition = {"type": RESUMED_BY_OPERATOR, "status": "true", "reason": text, "since": now,
                         "details": {"slurm_node": slurm_node, "mtc_reason": row["mtc_drain"]}}
            self._store.queue(db, NodeHealthReported(node_id, now, (condition,), source="operator"))
            self._ops.alert(db, "operator-resume", node_id, text)
            db.execute("UPDATE nodes SET drained_at = NULL WHERE node_id = ?", (node_id,))
            key = f"state:{slurm_node}"
            reason = row["cordon_reason"] or row["mtc_drain"]
            self._ops.put(db, key, "drain", {"node": slurm_node, "reason": reason},
                         replace=True, again=True)
            keys.append(key)
        return keys
