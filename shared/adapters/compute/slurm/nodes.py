"""The Slurm adapter's nodes: mapping mtc nodes to Slurm nodes, cordons, repairs, provisioning.

See ``compute`` for what each step does in Slurm. A repair runs once per (node,
attempt) and completes once (the shared ledger); an ok one is followed by a post-repair
report from a full run of the node's agent.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, cast

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.ledger import repair_completed
from shared.adapters.compute.slurm.agents import SlurmAgents, report_conditions
from shared.adapters.compute.slurm.api import (
    REBOOTS,
    NodeRecord,
    SlurmApi,
    drain_reason,
    foreign_reason,
    xid_line,
)
from shared.adapters.compute.slurm.cli import SlurmPermanentError
from shared.adapters.compute.slurm.ops import OpQueue, OpResult, log
from shared.adapters.compute.slurm.settings import SlurmSettings
from shared.adapters.compute.slurm.view import SlurmView
from shared.domain.events import NodeHealthReported, NodeProvisioned
from shared.domain.health import RepairAction
from shared.domain.model import Node, NodeRole

RA = RepairAction


def node_row(db: sqlite3.Connection, node_id: str) -> sqlite3.Row | None:
    """The mtc node's row in the ``nodes`` table."""
    row: sqlite3.Row | None = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
    return row


class SlurmNodes:
    """Nodes, repairs and provisioning over Slurm: the port's node calls, the ``reboot``,
    ``power_up`` and ``power_down`` operations, and what ``poll()`` sees of them."""

    def __init__(self, settings: SlurmSettings, store: FactStore, view: SlurmView,
                 cli: SlurmApi, ops: OpQueue, agents: SlurmAgents) -> None:
        self._settings = settings
        self._store = store
        self._view = view
        self._cli = cli
        self._ops = ops
        self._agents = agents
        ops.register("reboot", self._op_reboot, self._done_reboot, self._failed_reboot)
        ops.register("power_up", self._op_power_up, failed=self._failed_power_up)
        ops.register("power_down", self._op_power_down)

    def slurm_node_of(self, node_id: str) -> str | None:
        """The Slurm node an mtc node runs on now (None: not assigned, or deleted)."""
        with self._store.tx() as db:
            row = db.execute(
                "SELECT slurm_node FROM nodes WHERE node_id = ? AND deleted = 0", (node_id,)
            ).fetchone()
        return None if row is None else cast("str | None", row["slurm_node"])

    def node_id_of(self, slurm_node: str) -> str | None:
        with self._store.tx() as db:
            row = db.execute(
                "SELECT node_id FROM nodes WHERE slurm_node = ? AND deleted = 0", (slurm_node,)
            ).fetchone()
        return None if row is None else cast(str, row["node_id"])

    def mapping(self) -> dict[str, str]:
        """mtc node id -> Slurm node name, for nodes in use."""
        with self._store.tx() as db:
            rows = db.execute(
                "SELECT node_id, slurm_node FROM nodes WHERE deleted = 0 AND slurm_node IS NOT NULL"
                " ORDER BY node_id"
            ).fetchall()
        return {r["node_id"]: r["slurm_node"] for r in rows}

    def inject_xid(self, node_id: str, xid: int = 79, **line: Any) -> Path:
        """Append an XID line to the node's kernel log, as the driver would (tests, demo)."""
        slurm_node = self.slurm_node_of(node_id)
        if slurm_node is None:
            raise LookupError(f"node {node_id!r} has no Slurm node")
        path = self._agents.kernel_log(slurm_node)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(xid_line(xid, **line))
        return path

    def _op_reboot(self, args: dict[str, Any]) -> OpResult:
        node, reason = args["node"], args["reason"]
        record = next((r for r in self._cli.node_records() if r.name == node), None)
        if record is None:
            return OpResult(False, error=f"Invalid node name specified: {node}")
        theirs = foreign_reason(record)
        if theirs is not None:
            reason = theirs  # drained by someone else: the reboot keeps their reason
        elif not record.node.drained:  # a plain reboot of a drained node keeps it drained
            self._cli.drain(node, reason)
        issued = self._store.clock.now()
        self._cli.reboot_keep_drain(node, reason)
        return OpResult(True, data={"boot_before": record.slurmd_start_time, "issued_at": issued})

    def _op_power_up(self, args: dict[str, Any]) -> OpResult:
        try:
            self._cli.power_up(args["node"])
        except SlurmPermanentError:
            record = next((r for r in self._cli.node_records() if r.name == args["node"]), None)
            if record is None or record.node.powered_down:
                raise
        return OpResult(True)

    def _op_power_down(self, args: dict[str, Any]) -> OpResult:
        try:
            self._cli.power_down(args["node"])
        except SlurmPermanentError:
            record = next((r for r in self._cli.node_records() if r.name == args["node"]), None)
            if record is None or not (record.node.powered_down or "POWERING_DOWN" in record.flags):
                raise
        return OpResult(True)

    def _done_reboot(
        self, db: sqlite3.Connection, args: dict[str, Any], data: dict[str, Any], now: float
    ) -> None:
        db.execute(
            "UPDATE repairs SET boot_before = ?, issued_at = ? WHERE node_id = ? AND attempt = ?",
            (data["boot_before"], data["issued_at"], args["node_id"], args["attempt"]),
        )

    def _failed_reboot(self, db: sqlite3.Connection, args: dict[str, Any], error: str, now: float) -> None:
        rep = db.execute(
            "SELECT * FROM repairs WHERE node_id = ? AND attempt = ?",
            (args["node_id"], args["attempt"]),
        ).fetchone()
        if rep is not None and rep["completed_at"] is None:
            self._complete_repair(db, rep, now, False, f"scontrol reboot failed: {error}")

    def _failed_power_up(self, db: sqlite3.Connection, args: dict[str, Any], error: str, now: float) -> None:
        if not args.get("node_id"):
            return
        row = node_row(db, args["node_id"])
        if row is not None and row["provisioned"] == 0:
            db.execute("UPDATE nodes SET provisioned = -1 WHERE node_id = ?", (row["node_id"],))
            why = f"power up of {args['node']}: {error}"
            self._store.queue(db, NodeProvisioned(row["node_id"], False, why))

    # ------------------------------------------------------------ nodes

    def provision_node(self, node: Node) -> None:
        """Record the node; ``poll()`` assigns it a Slurm node and reports it up."""
        now = self._store.clock.now()
        with self._store.tx() as db:
            if node_row(db, node.node_id) is not None:
                return
            role = NodeRole(node.role).value
            db.execute(
                "INSERT INTO nodes (node_id, role, machine_type, wants_cloud, requested_at,"
                " provisioned) VALUES (?, ?, ?, ?, ?, 0)",
                (node.node_id, role, node.machine_type, int(bool(node.replaces)), now),
            )
            if role == NodeRole.LOGIN.value:  # no Slurm node: it is the controller's host
                db.execute("UPDATE nodes SET provisioned = 1 WHERE node_id = ?", (node.node_id,))
                self._store.queue(db, NodeProvisioned(node.node_id, True, "login node: the slurmctld host"))

    def cordon(self, node_id: str, reason: str) -> None:
        """Drain the node in Slurm with ``reason``: running jobs go on, no new ones start."""
        text = drain_reason(reason)
        with self._store.tx() as db:
            row = node_row(db, node_id)
            if row is None or row["deleted"]:
                return
            db.execute(
                "UPDATE nodes SET cordon = 'fault', cordon_reason = ? WHERE node_id = ?", (text, node_id)
            )
            key = self.want_state(db, row["slurm_node"], "drain", text)
        if key:
            self._ops.kick(key)

    def uncordon(self, node_id: str) -> None:
        """The node passed its checks: ``scontrol update state=resume``."""
        with self._store.tx() as db:
            row = node_row(db, node_id)
            if row is None or row["deleted"]:
                return
            db.execute("UPDATE nodes SET cordon = NULL, cordon_reason = '' WHERE node_id = ?", (node_id,))
            key = self.want_state(db, row["slurm_node"], "resume", "")
        if key:
            self._ops.kick(key)

    def want_state(self, db: sqlite3.Connection, slurm_node: str | None, want: str, reason: str) -> str:
        if not slurm_node:
            return ""  # applied when a Slurm node is assigned
        key = f"state:{slurm_node}"
        args = {"node": slurm_node, "reason": reason} if want == "drain" else {"node": slurm_node}
        self._ops.put(db, key, want, args, replace=True)
        return key

    def delete_node(self, node_id: str) -> None:
        """Release the node. One mtc took out for a fault leaves the fleet (powered down), so
        does a cloud node mtc powered up; a healthy static node goes back to the free pool."""
        keys: list[str] = []
        with self._store.tx() as db:
            row = node_row(db, node_id)
            if row is None or row["deleted"]:
                return
            db.execute("UPDATE nodes SET deleted = 1 WHERE node_id = ?", (node_id,))
            slurm_node = row["slurm_node"]
            if row["role"] != NodeRole.WORKER.value or not slurm_node:
                return
            if row["cloud"] or row["cordon"] == "fault":
                state_key = f"state:{slurm_node}"
                if row["cordon"] == "fault":
                    reason = drain_reason(f"retired: {row['cordon_reason'].removeprefix('mtc: ')}")
                    self._ops.put(db, state_key, "drain", {"node": slurm_node, "reason": reason},
                                  replace=True)
                    keys.append(state_key)
                key = f"power_down:{slurm_node}:{node_id}"
                self._ops.put(db, key, "power_down", {"node": slurm_node})
                keys.append(key)
            elif row["cordon"] is not None:
                keys.append(self.want_state(db, slurm_node, "resume", ""))
        self._ops.kick(*keys)

    # ------------------------------------------------------------ repairs

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        """Once per (node, attempt); a repeat, even with another action, is a no-op.
        RESET_GPU/REBOOT/REIMAGE reboot the Slurm node; REPLACE swaps in a cloud node;
        MANUAL never completes by itself."""
        action = RA(action)
        now = self._store.clock.now()
        keys: list[str] = []
        with self._store.tx() as db:
            row = node_row(db, node_id)
            slurm_node = row["slurm_node"] if row is not None else None
            inserted = self._store.ledger(db).start_repair(node_id, attempt, action.value, now,
                                                     slurm_node=slurm_node)
            if not inserted or row is None or row["deleted"] or not slurm_node:
                return
            if action in REBOOTS:
                key = f"repair:{node_id}:{attempt}"
                why = row["cordon_reason"].removeprefix("mtc: ") or "requested by mtc"
                reason = drain_reason(f"{action.value} (repair {attempt}): {why}")
                self._ops.put(
                    db,
                    key,
                    "reboot",
                    {"node": slurm_node, "reason": reason, "node_id": node_id, "attempt": attempt},
                )
                keys.append(key)
            elif action is RA.REPLACE:
                down = f"power_down:{slurm_node}:{node_id}"
                self._ops.put(db, down, "power_down", {"node": slurm_node})
                keys.append(down)
                db.execute(
                    "UPDATE nodes SET slurm_node = NULL, cloud = 0, wants_cloud = 1 WHERE node_id = ?",
                    (node_id,),
                )
                self._agents.forget(slurm_node)
        self._ops.kick(*keys)

    def _complete_repair(
        self, db: sqlite3.Connection, rep: sqlite3.Row, now: float, ok: bool, detail: str
    ) -> None:
        node_id = rep["node_id"]
        ledger = self._store.ledger(db)
        done = repair_completed(ledger, node_id, rep["attempt"], rep["action"], ok, detail, now)
        if done is None:
            return  # completed already
        self._store.queue(db, done)
        row = node_row(db, node_id)
        if not ok or row is None or not row["slurm_node"]:
            return
        report = self._agents.collect(row, now)
        conditions = report_conditions(report)
        self._store.queue(db, NodeHealthReported(node_id, now, conditions, source="post-repair-check"))
        self._agents.acknowledge(row["slurm_node"])
        db.execute(
            "UPDATE nodes SET next_report_at = ? WHERE node_id = ?",
            (now + self._settings.agent_interval_s, node_id),
        )

    def observe_repairs(self, db: sqlite3.Connection, now: float) -> None:
        for rep in db.execute(
            "SELECT * FROM repairs WHERE completed_at IS NULL ORDER BY started_at"
        ).fetchall():
            action = RA(rep["action"])
            row = node_row(db, rep["node_id"])
            if row is None or row["deleted"]:
                done = repair_completed(
                    self._store.ledger(db), rep["node_id"], rep["attempt"], action.value, False,
                    "unknown node", now,
                )
                self._store.queue(db, done if row is None else None)
                continue
            if action is RA.MANUAL:
                continue
            if action in (RA.NONE, RA.RESTART_JOB):
                self._complete_repair(db, rep, now, True, "nothing to do on the node")
                continue
            if not row["slurm_node"] and action is not RA.REPLACE:
                self._complete_repair(db, rep, now, False, "node has no Slurm node")
                continue
            if action in REBOOTS:
                self._observe_reboot(db, rep, row, action, now)
            elif action is RA.REPLACE:
                self._observe_replace(db, rep, row, now)

    def _observe_reboot(
        self, db: sqlite3.Connection, rep: sqlite3.Row, row: sqlite3.Row, action: RepairAction, now: float
    ) -> None:
        slurm_node = rep["slurm_node"]
        if rep["issued_at"] is None:  # the reboot command has not gone through yet
            if self._view.waited(rep["started_at"], now) > self._settings.repair_timeout_s:
                self._complete_repair(db, rep, now, False, f"reboot of {slurm_node} never issued")
            return
        record = self._view.records.get(slurm_node)
        back = (
            record is not None
            and record.slurmd_start_time != rep["boot_before"]
            and record.up
            and not record.rebooting
        )
        if back:
            assert record is not None
            self._agents.new_boot(slurm_node, wipe_scratch=action is RA.REIMAGE)
            what = "rebooted" if action is not RA.REIMAGE else "rebooted, scratch wiped (reimage)"
            detail = f"Slurm node {slurm_node} {what}; slurmd started at {record.slurmd_start_time}"
            self._complete_repair(db, rep, now, True, detail)
        elif self._view.waited(rep["issued_at"], now) > self._settings.repair_timeout_s:
            self._complete_repair(
                db, rep, now, False,
                f"{slurm_node} not back {self._settings.repair_timeout_s:g}s after reboot",
            )

    def _observe_replace(
        self, db: sqlite3.Connection, rep: sqlite3.Row, row: sqlite3.Row, now: float
    ) -> None:
        new = row["slurm_node"]
        record = self._view.records.get(new) if new else None
        if new and new != rep["slurm_node"] and record is not None and record.up:
            detail = f"Slurm node {rep['slurm_node']} powered down, replaced by {new}"
            self._complete_repair(db, rep, now, True, detail)
        elif self._view.waited(rep["started_at"], now) > self._settings.repair_timeout_s:
            self._complete_repair(db, rep, now, False,
                                  f"no replacement up after {self._settings.repair_timeout_s:g}s")

    # ------------------------------------------------------------ provisioning

    def assign_pending(self, db: sqlite3.Connection, now: float) -> list[str]:
        """Give each worker node waiting for one a Slurm node; returns operation keys."""
        waiting = db.execute(
            "SELECT * FROM nodes WHERE role = 'worker' AND deleted = 0 AND slurm_node IS NULL"
            " AND provisioned >= 0 ORDER BY requested_at, node_id"
        ).fetchall()
        if not waiting:
            return []
        taken = {
            r["slurm_node"]
            for r in db.execute("SELECT slurm_node FROM nodes WHERE deleted = 0 AND slurm_node IS NOT NULL")
        }
        leaving = {
            json.loads(r["args"])["node"]
            for r in db.execute(
                "SELECT args FROM ops WHERE kind = 'power_down' AND status IN ('pending', 'running')"
            )
        }
        keys: list[str] = []
        for row in waiting:
            free = [
                r
                for name, r in sorted(self._view.records.items())
                if name not in taken
                and name not in leaving
                and (self._settings.allowed is None or name in self._settings.allowed)
            ]
            static = [
                r for r in free if not r.cloud and r.up and r.node.state == "idle" and not r.node.drained
            ]
            cloud = [r for r in free if r.cloud and r.node.powered_down and "POWERING_DOWN" not in r.flags]
            choice = (cloud + static) if row["wants_cloud"] else (static + cloud)
            if not choice:
                if not row["alerted"]:
                    db.execute("UPDATE nodes SET alerted = 1 WHERE node_id = ?", (row["node_id"],))
                    self._ops.alert(db, "no-capacity", row["node_id"], "no free Slurm node (static or cloud)")
                continue
            record = choice[0]
            taken.add(record.name)
            keys.extend(self._assign(db, row, record, now))
        return keys

    def _assign(self, db: sqlite3.Connection, row: sqlite3.Row, record: NodeRecord, now: float) -> list[str]:
        node_id, slurm_node = row["node_id"], record.name
        db.execute(
            "UPDATE nodes SET slurm_node = ?, cloud = ?, assigned_at = ? WHERE node_id = ?",
            (slurm_node, int(record.cloud), now, node_id),
        )
        self._agents.new_boot(slurm_node, wipe_scratch=True)  # a machine new to this node id
        keys = []
        if record.cloud:
            key = f"power_up:{slurm_node}:{node_id}"
            self._ops.put(db, key, "power_up", {"node": slurm_node, "node_id": node_id})
            keys.append(key)
        if row["cordon"] == "fault":
            reason = row["cordon_reason"]
        else:
            reason = drain_reason(f"{node_id} provisioned, running its first checks")
            db.execute(
                "UPDATE nodes SET cordon = 'verify', cordon_reason = ? WHERE node_id = ?", (reason, node_id)
            )
        keys.append(self.want_state(db, slurm_node, "drain", reason))
        log.info("mtc node %s -> Slurm node %s%s", node_id, slurm_node, " (cloud)" if record.cloud else "")
        return keys

    def observe_provisioning(self, db: sqlite3.Connection, now: float) -> None:
        for row in db.execute(
            "SELECT * FROM nodes WHERE role = 'worker' AND deleted = 0 AND provisioned = 0"
            " ORDER BY requested_at, node_id"
        ).fetchall():
            node_id, slurm_node = row["node_id"], row["slurm_node"]
            record = self._view.records.get(slurm_node) if slurm_node else None
            if record is not None and record.up and not record.rebooting:
                db.execute(
                    "UPDATE nodes SET provisioned = 1, next_report_at = ? WHERE node_id = ?", (now, node_id)
                )
                kind = "cloud node, powered up" if row["cloud"] else "static node"
                self._store.queue(db, NodeProvisioned(node_id, True, f"Slurm node {slurm_node} ({kind})"))
            elif self._view.waited(row["requested_at"], now) > self._settings.provision_timeout_s:
                db.execute("UPDATE nodes SET provisioned = -1 WHERE node_id = ?", (node_id,))
                what = f"Slurm node {slurm_node} not up" if slurm_node else "no free Slurm node"
                after = f"{what} after {self._settings.provision_timeout_s:g}s"
                self._store.queue(db, NodeProvisioned(node_id, False, after))

