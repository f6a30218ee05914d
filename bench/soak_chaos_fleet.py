"""The soak's chaos on the fleet and the control plane: health faults of every kind on idle
and busy nodes (the path ``mtc node fault`` takes), SIGKILL of one rank / every rank / a
launcher, SIGSTOP of a rank (a hang), controller kills, a second process pumping the bus as
CLI commands do, replays of delivered envelopes (duplicated, delayed, reordered, past the
accepted age), stale health reports (observed before the node's last repair) and operator
drains (``mtc node drain``; a later one resumes the earlier), which mtc must never undo.

Each ``chaos_<kind>`` returns whether it happened; the soak draws the kind (``CHAOS_WEIGHTS``)
and records what was done to whom (``Soak.watch``, ``Soak.hung``, ``Soak.operator_drained``)
for its invariants. The storage and client chaos is :mod:`bench.soak_chaos`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sqlite3
from collections import deque
from typing import TYPE_CHECKING, Any

from bench.soak_records import NodeWatch, proc_table, rank_pids
from bench.soak_settings import (
    AUX,
    CLI_PUMP_BUDGET_S,
    CONTROLLER_DOWN_S,
    FAULT_KINDS,
    MAIN,
    OPERATOR_DRAINS_AT_ONCE,
    REPLAY_KINDS,
    SETTINGS,
    WORKER_KILL_KINDS,
    XID_CHOICES,
)
from services.cli.commands_local import fault_conditions
from services.repair import operator
from services.wiring.builder import COMPUTE_SOURCES
from services.wiring.embedded import EmbeddedApp
from shared.adapters.outbox import envelope_from_doc, make_envelope
from shared.domain.errors import MtcError
from shared.domain.events import Envelope, NodeHealthReported
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.domain.model import Node, NodeRole, NodeState

if TYPE_CHECKING:
    from bench.soak import Soak


def operator_drain(app: EmbeddedApp, node_id: str, verb: str = operator.DRAIN) -> bool:
    """Drain ``node_id`` as an operator would (not mtc): the command ``mtc node drain`` and
    ``:drain`` run (``services.repair.operator``); True when applied. The soak records the
    drain in ``Soak.operator_drained`` and checks that mtc never undoes it. With ``verb``
    ``resume``: the operator lifts it (False while the node is still draining)."""
    try:
        with app.transaction() as uow:
            node = uow.nodes.get(node_id)
            if node is None:
                return False
            operator.act(verb, node.cluster_id, node_id, "soak: operator maintenance",
                         "soak-operator", uow, app.deps)
    except MtcError:
        return False
    return True


class FleetChaos:
    """The kinds above, acting through the soak's handle on the state and its compute."""

    def __init__(self, soak: Soak) -> None:
        self.s = soak
        self.pool: deque[dict[str, Any]] = deque(maxlen=400)  # delivered envelopes seen
        self.pool_cursor = 0.0

    def live_workers(self) -> list[Node]:
        with self.s.a.transaction() as uow:
            nodes = [*uow.nodes.list(MAIN), *uow.nodes.list(AUX)]
        return [n for n in nodes if n.role is NodeRole.WORKER and n.state is not NodeState.RETIRED]

    def chaos_fault(self) -> bool:
        nodes = self.live_workers()
        if not nodes:
            return False
        node = self.s.rng.choice(nodes)
        kind = self.s.rng.choice(FAULT_KINDS)
        ns = argparse.Namespace(xid=None, ecc_dbe=None, row_remap_failure=False, dcgm_fail=None,
                                thermal=None, disk=None, slow=None)
        if kind == "xid":
            ns.xid = [self.s.rng.choice(XID_CHOICES)]
        elif kind == "ecc_dbe":
            ns.ecc_dbe = self.s.rng.randint(1, 4)
        elif kind == "row_remap_failure":
            ns.row_remap_failure = True
        elif kind == "dcgm":
            ns.dcgm_fail = self.s.rng.randint(1, 4)
        elif kind == "thermal":
            ns.thermal = self.s.rng.choice((85.0, 95.0))
        elif kind == "disk":
            ns.disk = self.s.rng.choice((0.93, 0.99))
        else:
            ns.slow = self.s.rng.choice((0.3, 0.7))
        return self.inject(node, ns, f"xid{ns.xid[0]}" if kind == "xid" else kind)

    def inject(self, node: Node, ns: argparse.Namespace | None = None, label: str = "xid79"
               ) -> bool:
        """A health fault on ``node`` (default an XID 79) as `mtc node fault` injects it."""
        if ns is None:
            ns = argparse.Namespace(xid=[79], ecc_dbe=None, row_remap_failure=False,
                                    dcgm_fail=None, thermal=None, disk=None, slow=None)
        conditions = fault_conditions(ns, self.s.now())
        try:
            self.s.a.compute.inject_fault(node.node_id, conditions)
        except LookupError:
            return False
        self.s.fig.faults[label] += 1
        self.s.fig.faults["on busy node" if node.job_id else "on idle node"] += 1
        self.s.watch.setdefault(node.node_id, NodeWatch()).last_fault_at = self.s.now()
        return True

    def live_attempts(self) -> list[list[sqlite3.Row]]:
        with self.s.compute_db() as db:
            rows = db.execute(
                "SELECT w.* FROM workers w JOIN attempts a ON a.job_id = w.job_id AND"
                " a.attempt = w.attempt WHERE a.finalized = 0 ORDER BY w.job_id, w.attempt,"
                " w.rank").fetchall()
        by: dict[tuple[str, int], list[sqlite3.Row]] = {}
        for r in rows:
            by.setdefault((r["job_id"], r["attempt"]), []).append(r)
        return list(by.values())

    def chaos_worker_kill(self) -> bool:
        attempts = self.live_attempts()
        if not attempts:
            return False
        ranks = self.s.rng.choice(attempts)
        kind = self.s.rng.choice(WORKER_KILL_KINDS)
        procs = proc_table()
        targets: list[int] = []
        if kind == "rank":
            targets = [p.pid for p in rank_pids(self.s.rng.choice(ranks)["pid"], procs)]
        elif kind == "all_ranks":
            targets = [p.pid for r in ranks for p in rank_pids(r["pid"], procs)]
        else:
            launcher = self.s.rng.choice(ranks)["pid"]
            targets = [launcher] if procs.get(launcher) else []
        if not targets:
            return False
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.s.fig.kills[f"worker {kind}"] += 1
        planned = self.s.jobs.get(ranks[0]["job_id"])
        if planned is not None:
            planned.killed = True
        return True

    def chaos_hang(self) -> bool:
        attempts = self.live_attempts()
        if not attempts:
            return False
        rank = self.s.rng.choice(self.s.rng.choice(attempts))
        targets = rank_pids(rank["pid"], proc_table())
        for p in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGSTOP)
        if targets:
            self.s.fig.kills["worker hang (SIGSTOP)"] += 1
            self.s.hung[rank["job_id"]] = (f"the soak SIGSTOPped rank {rank['rank']} of attempt "
                                           f"{rank['attempt']} at {self.s.rel():.0f} s")
        return bool(targets)

    def chaos_controller_kill(self) -> bool:
        if not self.s.controller.running():
            return False
        self.s.controller.kill(self.s.rng.uniform(*CONTROLLER_DOWN_S))
        self.s.fig.kills["controller SIGKILL"] += 1
        return True

    def chaos_cli_pump(self) -> bool:
        """A second deliverer, as every `mtc` command that pumps after itself is."""
        self.s.a.pump(budget_s=CLI_PUMP_BUDGET_S)
        return True

    def refresh_pool(self) -> None:
        log = self.s.a.deps.event_log
        if log is None:
            return
        for doc in log.read(since=self.pool_cursor):
            if doc["time"] < self.pool_cursor:
                continue
            if self.s.rng.random() < 0.2:
                self.pool.append(doc)
            self.pool_cursor = max(self.pool_cursor, doc["time"])
        self.pool_cursor += 1e-6

    def chaos_replay(self) -> bool:
        self.refresh_pool()
        now = self.s.now()
        age_max = SETTINGS["max_event_age_s"]
        kind = self.s.rng.choice(REPLAY_KINDS)
        bands = {"duplicate": (0.0, 5.0), "delayed": (10.0, age_max - 5.0),
                 "reordered": (0.0, age_max - 5.0), "expired": (age_max + 5.0, math.inf)}
        lo, hi = bands[kind]
        docs = [d for d in self.pool if lo <= now - d["time"] < hi]
        if not docs:
            return False
        batch = self.s.rng.sample(docs, min(len(docs), 6 if kind == "reordered" else 2))
        if kind == "reordered":
            batch.sort(key=lambda d: d["time"], reverse=True)
        for doc in batch:
            env = envelope_from_doc(doc)
            if isinstance(env.event, NodeHealthReported):
                self.s.watch.setdefault(env.event.node_id, NodeWatch()).last_stale_at = now
            self.s.a.bus.inject(env)
        self.s.fig.replays[kind] += len(batch)
        return True

    def chaos_stale_report(self) -> bool:
        """A report of a fault observed *before* the node's last repair, delivered now."""
        with self.s.compute_db() as db:
            rows = db.execute(
                "SELECT r.node_id, max(r.completed_at) AS done FROM repairs r WHERE"
                " r.completed_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM faults f WHERE"
                " f.node_id = r.node_id) GROUP BY r.node_id").fetchall()
        in_service = {n.node_id for n in self.live_workers() if n.in_service}
        rows = [r for r in rows if r["node_id"] in in_service]
        if not rows:
            return False
        row = self.s.rng.choice(rows)
        observed = float(row["done"]) - self.s.rng.uniform(0.5, 5.0)
        conds = [Condition(t.value, ConditionStatus.FALSE, "ok", observed)
                 for t in ConditionType if t is not ConditionType.XID_ERROR]
        conds.append(Condition(ConditionType.XID_ERROR.value, ConditionStatus.TRUE,
                               "NVRM: Xid 79 (stale)", observed - 1.0, {"xids": [79]}))
        event = NodeHealthReported(row["node_id"], observed, tuple(c.to_dict() for c in conds),
                                   source="agent")
        env: Envelope = make_envelope(event, COMPUTE_SOURCES["local"], self.s.now())
        self.s.a.bus.inject(env)
        self.s.watch.setdefault(row["node_id"], NodeWatch()).last_stale_at = self.s.now()
        self.s.fig.replays["stale report"] += 1
        return True

    def chaos_operator_drain(self) -> bool:
        if len(self.s.operator_drained) >= OPERATOR_DRAINS_AT_ONCE:
            return self.operator_resume(min(self.s.operator_drained,
                                            key=self.s.operator_drained.__getitem__))
        nodes = [n for n in self.live_workers() if n.in_service]
        if not nodes:
            return False
        node = self.s.rng.choice(nodes)
        if operator_drain(self.s.a, node.node_id):
            self.s.operator_drained[node.node_id] = self.s.now()
            self.s.fig.chaos["operator drain (done)"] += 1
            return True
        self.s.fig.chaos["operator drain (refused)"] += 1
        return False

    def operator_resume(self, node_id: str) -> bool:
        """The operator lifts their drain (from then on mtc may return the node)."""
        if not operator_drain(self.s.a, node_id, operator.RESUME):
            return False
        self.s.operator_drained.pop(node_id, None)
        self.s.fig.chaos["operator resume"] += 1
        return True
