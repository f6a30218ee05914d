"""Machine lifecycle on Compute Engine: the ``Compute`` port's node half.

``GceCompute`` creates, repairs and deletes the instances behind mtc nodes with the official
client (``api``), and watches them for planned maintenance. It does not run workers:
``split.MachinesAndWorkers`` composes it with an adapter that does (Slurm on those
machines, or local processes), and that composite is what passes the Compute contract.

Every port call returns at once: it records a *task* (provision, repair, delete) keyed by its
idempotency key in this adapter's sqlite state, and ``poll()`` moves each task through its
steps, one zone operation at a time, never blocking on one (``zoneOperations.get``):

* provision: ``insert`` (machine type, GPUs, ``provisioningModel`` STANDARD / SPOT /
  FLEX_START and reservation affinity from the pool's ``PoolSettings``)
* RESET_GPU: ``reset`` (Compute Engine cannot reset one GPU: a hard reset of the VM)
* REBOOT: ``stop`` then ``start`` (a start places the VM anew, on a healthy host, past a
  host's pending maintenance; a guest ``reboot`` would keep the host)
* REIMAGE: ``delete`` then ``insert`` from the pool's image (the boot disk is auto-deleted)
* REPLACE: ``reportHostAsFaulty`` (IMMEDIATE, with the drain's reason as the fault
  description), then ``delete`` and ``insert``
* delete: ``delete`` (an instance already gone is done)
* NONE / RESTART_JOB complete at once; MANUAL never completes by itself.

Each call carries a ``requestId`` derived from the task, step and round, so a retry after a
lost answer is applied once by Compute Engine. Each operation has a deadline
(``operation_timeout_s``): past it the task fails (a failed ``NodeProvisioned`` or
``NodeRepairCompleted``). Failures are classified (``gce_api.classify``): transient ones
(5xx, rate limits, a connection refused) are retried with backoff; stock-outs and quota
(``ZONE_RESOURCE_POOL_EXHAUSTED``, ``QUOTA_EXCEEDED``...) are a *capacity wait*: retried with
backoff up to ``capacity_max_s`` apart, for as long as it takes, shown by ``waits()``, an
``alerts()`` entry and an ``AlertRaised`` (firing, then resolved), never a failure; others fail
the task. Results are facts emitted once each through the fact outbox (``FactStore``):
``NodeProvisioned`` (or, in a composite, the node handed to the workers side with
``on_ready``, which reports it up once it joined), ``NodeRepairCompleted`` then its
post-repair ``NodeHealthReported`` (what Compute Engine can vouch for: the VM runs, no
maintenance pending; the node agent reports the GPU checks).

Maintenance (``maintenance``). Every ``watch_interval_s`` each running instance is read and its
``resourceStatus.upcomingMaintenance`` turned into the ``UpcomingMaintenance`` condition,
reported on change only (conditions are state) with source ``compute-engine``. Triage maps a
TRUE one to a reboot: the node is cordoned, its job checkpoints and moves, and the reboot
(stop/start) takes the VM off the host before the window opens.

One process drives a state file at a time (the executor); API calls run outside the state's
transactions.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.gce.api import (
    Failure,
    GceApi,
    GceError,
    fault_behavior,
    instance_body,
    instance_name,
    operation_error,
)
from shared.adapters.compute.gce.maintenance import MaintenanceWatch, migrate_lost
from shared.adapters.compute.ledger import repair_completed
from shared.domain.events import AlertRaised, NodeProvisioned
from shared.domain.health import COMPUTE_SOURCE, ConditionType, RepairAction
from shared.domain.model import Node
from shared.ports import Clock, Emitter

log = logging.getLogger("mtc.compute.gce")
RA = RepairAction
MAINTENANCE = ConditionType.UPCOMING_MAINTENANCE.value
STEPS: Mapping[RepairAction, tuple[str, ...]] = {
    RA.NONE: (), RA.RESTART_JOB: (),
    RA.RESET_GPU: ("reset",),
    RA.REBOOT: ("stop", "start"),
    RA.REIMAGE: ("delete", "insert"),
    RA.REPLACE: ("faulty", "delete", "insert"),
}
_RUNNING_AFTER = frozenset({"insert", "start", "reset", "faulty"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY, instance TEXT NOT NULL, data TEXT NOT NULL,
    requested_at REAL NOT NULL, provisioned INTEGER NOT NULL DEFAULT 0,
    handed INTEGER NOT NULL DEFAULT 0, deleted INTEGER NOT NULL DEFAULT 0,
    cordon_reason TEXT NOT NULL DEFAULT '', maintenance TEXT NOT NULL DEFAULT '',
    next_watch_at REAL NOT NULL DEFAULT 0, life INTEGER NOT NULL DEFAULT 1,
    lost TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS repairs (
    node_id TEXT NOT NULL, attempt INTEGER NOT NULL, action TEXT NOT NULL,
    started_at REAL NOT NULL, completed_at REAL, PRIMARY KEY (node_id, attempt));
CREATE TABLE IF NOT EXISTS tasks (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, node_id TEXT NOT NULL, kind TEXT NOT NULL,
    action TEXT NOT NULL DEFAULT '', attempt INTEGER NOT NULL DEFAULT 0,
    steps TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0, round INTEGER NOT NULL DEFAULT 0,
    op TEXT, deadline REAL, next_at REAL NOT NULL, tries INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'active', detail TEXT NOT NULL DEFAULT '',
    capacity_since REAL);
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
    subject TEXT NOT NULL, detail TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Wait:
    """A task waiting for capacity (``GceCompute.waits()``)."""

    node_id: str
    kind: str
    since: float
    detail: str
    next_try_at: float


@dataclass(frozen=True)
class GceAlert:
    at: float
    kind: str
    subject: str
    detail: str


class GceCompute:
    """Machine lifecycle on Compute Engine (see the module docstring); holds its store and
    its maintenance watch."""

    DB_FILE = "gce_compute.sqlite3"

    def __init__(
        self,
        state_dir: Path,
        emit: Emitter,
        clock: Clock,
        api: GceApi,
        *,
        on_ready: Callable[[Node], None] | None = None,
        operation_timeout_s: float = 900.0,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
        capacity_initial_s: float = 30.0,
        capacity_max_s: float = 600.0,
        watch_interval_s: float = 60.0,
        wait_operations: bool = False,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self.api = api
        self.on_ready = on_ready
        self._op_timeout = operation_timeout_s
        self._retry = (retry_initial_s, retry_max_s)
        self._capacity = (capacity_initial_s, capacity_max_s)
        self._wait = wait_operations  # zoneOperations.wait: a one-shot process (power saving)
        self.store = FactStore(self.state_dir / self.DB_FILE, _SCHEMA, emit, clock)
        migrate_lost(self.store)
        self.maintenance = MaintenanceWatch(self.store, api, watch_interval_s)

    # ------------------------------------------------------------ the port (machines)

    def provision_node(self, node: Node) -> None:
        """Record the node and its provisioning task (once per life: a node deleted before,
        a power-saved Slurm node resumed, gets a new instance)."""
        now = self._clock.now()
        name = instance_name(self.api.config, node.node_id)
        with self.store.tx() as db:
            row = db.execute("SELECT deleted, life FROM nodes WHERE node_id = ?",
                             (node.node_id,)).fetchone()
            if row is not None and not row["deleted"]:
                return
            life = 1 if row is None else row["life"] + 1
            db.execute(
                "INSERT OR REPLACE INTO nodes (node_id, instance, data, requested_at, life)"
                " VALUES (?, ?, ?, ?, ?)",
                (node.node_id, name, json.dumps(node.to_dict()), now, life))
            self._put_task(db, f"provision:{node.node_id}:{life}", node.node_id, "provision",
                           ("insert",), now)

    def cordon(self, node_id: str, reason: str) -> None:
        """Remember why (a replace reports it as the host's fault); the workers side fences."""
        with self.store.tx() as db:
            db.execute("UPDATE nodes SET cordon_reason = ? WHERE node_id = ?", (reason, node_id))

    def uncordon(self, node_id: str) -> None:
        with self.store.tx() as db:
            db.execute("UPDATE nodes SET cordon_reason = '' WHERE node_id = ?", (node_id,))

    def delete_node(self, node_id: str) -> None:
        now = self._clock.now()
        with self.store.tx() as db:
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
            if node is None or node["deleted"]:
                return
            db.execute("UPDATE nodes SET deleted = 1 WHERE node_id = ?", (node_id,))
            db.execute("UPDATE tasks SET status = 'cancelled', detail = 'node deleted'"
                       " WHERE node_id = ? AND status = 'active'", (node_id,))
            self._put_task(db, f"delete:{node_id}:{node['life']}", node_id, "delete",
                           ("delete",), now)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        action = RA(action)
        now = self._clock.now()
        with self.store.tx() as db:
            if not self.store.ledger(db).start_repair(node_id, attempt, action.value, now):
                return  # this attempt was asked for already, whatever the action
            if action is RA.MANUAL:
                return  # a person repairs it; nothing completes by itself
            self._put_task(db, f"repair:{node_id}:{attempt}:{self._life(db, node_id)}", node_id,
                           "repair",
                           STEPS.get(action, ()), now, action=action.value, attempt=attempt)

    # ------------------------------------------------------------ what people look at

    def waits(self) -> list[Wait]:
        """Tasks waiting for capacity (a stock-out, a quota): visible, not failed."""
        with self.store.tx() as db:
            rows = db.execute("SELECT * FROM tasks WHERE status = 'active' AND"
                              " capacity_since IS NOT NULL ORDER BY seq").fetchall()
        return [Wait(r["node_id"], r["kind"], r["capacity_since"], r["detail"], r["next_at"])
                for r in rows]

    def alerts(self) -> list[GceAlert]:
        with self.store.tx() as db:
            rows = db.execute("SELECT * FROM alerts ORDER BY id").fetchall()
        return [GceAlert(r["at"], r["kind"], r["subject"], r["detail"]) for r in rows]

    def tasks(self, node_id: str) -> list[dict[str, Any]]:
        """The node's tasks, oldest first (kind, status, detail...)."""
        with self.store.tx() as db:
            rows = db.execute("SELECT * FROM tasks WHERE node_id = ? ORDER BY seq",
                              (node_id,)).fetchall()
        return [dict(r) for r in rows]

    def running(self, node_id: str) -> bool:
        """Whether the node's present instance was made and is not being deleted."""
        with self.store.tx() as db:
            row = db.execute("SELECT provisioned, deleted FROM nodes WHERE node_id = ?",
                             (node_id,)).fetchone()
        return bool(row and row["provisioned"] and not row["deleted"])

    def instance_of(self, node_id: str) -> str | None:
        with self.store.tx() as db:
            row = db.execute("SELECT instance FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return str(row[0]) if row else None

    # ------------------------------------------------------------ poll

    def poll(self) -> None:
        """Move every due task one step, watch for maintenance, emit what happened."""
        now = self._clock.now()
        with self.store.tx() as db:
            # a node's tasks run one at a time, in the order asked (a provision after a
            # delete of the same node waits for the delete)
            due = db.execute(
                "SELECT key FROM tasks t WHERE status = 'active' AND next_at <= ? AND NOT EXISTS"
                " (SELECT 1 FROM tasks o WHERE o.node_id = t.node_id AND o.status = 'active'"
                " AND o.seq < t.seq) ORDER BY seq", (now,)).fetchall()
        for row in due:
            for _ in range(8):  # a step that finished lets the next one start in this poll
                if not self._advance(row["key"]):
                    break
        self.maintenance.watch()
        self.store.drain()
        self._hand_over()

    def _advance(self, key: str) -> bool:
        """One move of the task; True when another may follow at once."""
        with self.store.tx() as db:
            task = db.execute("SELECT * FROM tasks WHERE key = ?", (key,)).fetchone()
            if task["status"] != "active":
                return False
            node = db.execute("SELECT * FROM nodes WHERE node_id = ?",
                              (task["node_id"],)).fetchone()
        steps: list[str] = json.loads(task["steps"])
        try:
            if task["op"]:
                op = self.api.operation(task["op"], wait=self._wait)
                if op["status"] != "DONE":
                    if self._clock.now() > (task["deadline"] or float("inf")):
                        self._fail(key, f"{steps[task['step']]} operation {task['op']} not done"
                                   f" after {self._op_timeout:g}s")
                    return False
                error = operation_error(op)
                if error is not None:
                    raise error
                self._next_step(key, task["step"] + 1)
                return True
            if task["step"] < len(steps):
                return self._issue(key, task, node, steps[task["step"]]) or self._wait
            self._finish(key, task, node, steps)
        except GceError as exc:
            self._failed_try(key, task, exc)
        return False

    def _issue(self, key: str, task: sqlite3.Row, node: sqlite3.Row, step: str) -> bool:
        """Start the step's operation; True when the step needed none (done already)."""
        name = node["instance"]
        rid = f"{key}/{task['step']}/{task['round']}"
        try:
            if step == "insert":
                body = instance_body(self.api.config, Node.from_dict(json.loads(node["data"])),
                                     name)
                op = self.api.insert(body, rid)
            elif step == "faulty":
                reason = node["cordon_reason"] or f"mtc {task['action']} attempt {task['attempt']}"
                op = self.api.report_host_as_faulty(name, rid, [(fault_behavior(reason), reason)])
            else:
                op = self.api.act(step, name, rid)
        except GceError as exc:
            if step == "insert" and exc.code == "alreadyExists":
                self._next_step(key, task["step"] + 1)  # made by an earlier try: fine
                return True
            if step == "delete" and exc.code == "notFound":
                self._next_step(key, task["step"] + 1)  # gone already: what delete wants
                return True
            if step == "faulty" and exc.code == "notFound":
                # no instance to report (preempted and deleted, or removed behind mtc's
                # back): no host to vouch against, so the replace goes on to recreate it
                self._next_step(key, task["step"] + 1)
                return True
            raise
        now = self._clock.now()
        with self.store.tx() as db:
            db.execute("UPDATE tasks SET op = ?, deadline = ?, next_at = ? WHERE key = ?",
                       (op, now + self._op_timeout, now, key))
        return False

    def _next_step(self, key: str, step: int) -> None:
        with self.store.tx() as db:
            db.execute("UPDATE tasks SET step = ?, op = NULL, deadline = NULL, tries = 0,"
                       " next_at = ? WHERE key = ?", (step, self._clock.now(), key))
            self._capacity_over(db, key)

    def _finish(self, key: str, task: sqlite3.Row, node: sqlite3.Row, steps: list[str]) -> None:
        """Every step is done: check the VM runs (when it should), then report."""
        inst: dict[str, Any] | None = None
        if task["kind"] != "delete" and (not steps or steps[-1] in _RUNNING_AFTER):
            inst = self.api.get(node["instance"])
            status = (inst or {}).get("status", "")
            if status != "RUNNING":  # STAGING a while longer, until the deadline
                now = self._clock.now()
                with self.store.tx() as db:
                    db.execute("UPDATE tasks SET deadline = COALESCE(deadline, ?) WHERE key = ?",
                               (now + self._op_timeout, key))
                    deadline = db.execute("SELECT deadline FROM tasks WHERE key = ?",
                                          (key,)).fetchone()[0]
                if now > deadline:
                    self._fail(key, f"instance {node['instance']} is {status or 'missing'},"
                               " not RUNNING")
                return
        now = self._clock.now()
        with self.store.tx() as db:
            db.execute("UPDATE tasks SET status = 'done', op = NULL WHERE key = ?", (key,))
            self._capacity_over(db, key)
            node_id = task["node_id"]
            if task["kind"] == "provision":
                db.execute("UPDATE nodes SET provisioned = 1, next_watch_at = ? WHERE node_id = ?",
                           (now + self.maintenance.watch_interval_s, node_id))
                if self.on_ready is None:
                    self.store.queue(db, NodeProvisioned(node_id, True,
                                                    f"instance {node['instance']} RUNNING"))
                    self.store.queue(db, self.maintenance.report(db, node_id, inst, now, COMPUTE_SOURCE,
                                                 force=True))
            elif task["kind"] == "repair":
                detail = f"{task['action']}: " + (", ".join(steps) or "nothing to do") + " done"
                done = repair_completed(self.store.ledger(db), node_id, task["attempt"],
                                        task["action"], True, detail, now)
                self.store.queue(db, done)
                if done is not None:
                    self.store.queue(db, self.maintenance.report(db, node_id, inst, now, "post-repair-check",
                                                 force=True))

    def _fail(self, key: str, detail: str) -> None:
        now = self._clock.now()
        with self.store.tx() as db:
            task = db.execute("SELECT * FROM tasks WHERE key = ?", (key,)).fetchone()
            if task is None or task["status"] != "active":
                return
            db.execute("UPDATE tasks SET status = 'failed', detail = ?, op = NULL WHERE key = ?",
                       (detail, key))
            self._capacity_over(db, key)
            self._alert(db, f"gce-{task['kind']}-failed", task["node_id"], detail)
            if task["kind"] == "provision":
                self.store.queue(db, NodeProvisioned(task["node_id"], False, detail))
            elif task["kind"] == "repair":
                self.store.queue(db, repair_completed(self.store.ledger(db), task["node_id"],
                                                 task["attempt"], task["action"], False,
                                                 detail, now))

    def _failed_try(self, key: str, task: sqlite3.Row, exc: GceError) -> None:
        if exc.kind is Failure.PERMANENT:
            self._fail(key, str(exc))
            return
        now = self._clock.now()
        tries = task["tries"] + 1
        first, cap = self._capacity if exc.kind is Failure.CAPACITY else self._retry
        delay = min(cap, first * 2 ** (tries - 1))
        # an operation that ended in error is over: the next try is a new request
        new_round = task["round"] + (1 if task["op"] else 0)
        with self.store.tx() as db:
            db.execute("UPDATE tasks SET tries = ?, next_at = ?, op = NULL, deadline = NULL,"
                       " round = ?, detail = ? WHERE key = ?",
                       (tries, now + delay, new_round, str(exc)[:1000], key))
            if exc.kind is Failure.CAPACITY and task["capacity_since"] is None:
                db.execute("UPDATE tasks SET capacity_since = ? WHERE key = ?", (now, key))
                self._alert(db, "gce-capacity-wait", task["node_id"], str(exc))
                self.store.queue(db, AlertRaised(
                    kind="capacity_wait", target=task["node_id"], state="firing",
                    severity="warning", first_at=now, node_id=task["node_id"],
                    summary=f"waiting for capacity to {task['kind']} {task['node_id']}: {exc}"))
        log.warning("%s %s: %s; retrying in %.0fs", task["kind"], task["node_id"], exc, delay)

    def _capacity_over(self, db: sqlite3.Connection, key: str) -> None:
        task = db.execute("SELECT * FROM tasks WHERE key = ?", (key,)).fetchone()
        if task is None or task["capacity_since"] is None:
            return
        db.execute("UPDATE tasks SET capacity_since = NULL WHERE key = ?", (key,))
        self.store.queue(db, AlertRaised(
            kind="capacity_wait", target=task["node_id"], state="resolved", severity="warning",
            first_at=task["capacity_since"], node_id=task["node_id"], sent=2,
            summary=f"capacity wait for {task['node_id']} over ({task['status']})"))

    # ------------------------------------------------------------ internals

    def _hand_over(self) -> None:
        """A composite's workers side gets each node once its instance runs (at least once:
        ``provision_node`` is idempotent there)."""
        if self.on_ready is None:
            return
        with self.store.tx() as db:
            rows = db.execute("SELECT node_id, data FROM nodes WHERE provisioned = 1"
                              " AND handed = 0 AND deleted = 0").fetchall()
        for row in rows:
            self.on_ready(Node.from_dict(json.loads(row["data"])))
            with self.store.tx() as db:
                db.execute("UPDATE nodes SET handed = 1 WHERE node_id = ?", (row["node_id"],))

    def _put_task(self, db: sqlite3.Connection, key: str, node_id: str, kind: str,
                  steps: tuple[str, ...], now: float, *, action: str = "", attempt: int = 0
                  ) -> None:
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM tasks").fetchone()[0]
        db.execute("INSERT OR REPLACE INTO tasks (key, seq, node_id, kind, action, attempt,"
                   " steps, next_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (key, seq, node_id, kind, action, attempt, json.dumps(list(steps)), now))

    @staticmethod
    def _life(db: sqlite3.Connection, node_id: str) -> int:
        row = db.execute("SELECT life FROM nodes WHERE node_id = ?", (node_id,)).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        """Close the state file. Instances keep running: they outlive this object."""
        self.store.close()

    def _alert(self, db: sqlite3.Connection, kind: str, subject: str, detail: str) -> None:
        log.warning("ALERT %s %s: %s", kind, subject, detail)
        db.execute("INSERT INTO alerts (at, kind, subject, detail) VALUES (?, ?, ?, ?)",
                   (self._clock.now(), kind, subject, detail[:1000]))

