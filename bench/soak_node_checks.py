"""The chaos soak's invariants on nodes and workers, checked against the control plane's
state *and* the ground truth (LocalCompute's sqlite file: the faults a node really has,
worker pids and exit codes; ``/proc``): no node lost, stuck or owned by two clusters, no drain
without a fault and no operator drain undone, a node the blast-radius guard held taken out
once there is room, no job on a node with a critical fault, a gang ends when one rank dies,
and no worker process outlives its attempt.
"""

from __future__ import annotations

import math
import sqlite3
from typing import TYPE_CHECKING

from bench.soak_records import NodeWatch, ProcInfo
from bench.soak_settings import (
    CAUSE_SLACK_S,
    EVICT_BOUND_S,
    FINAL_QUIET_S,
    GANG_END_BOUND_S,
    HELD_BOUND_S,
    ORPHAN_BOUND_S,
    OUT_OF_SERVICE,
    PLACEMENT_SLACK_S,
    SETTINGS,
    STALE_WATCH_S,
    TAKES_NODE_OUT,
    TRANSIENT,
)
from shared.domain.model import Job, Node, NodeRole, NodeState

if TYPE_CHECKING:
    from bench.soak import Soak


class NodeChecks:
    """Every node and every worker process the soak's clusters have."""

    def __init__(self, soak: Soak) -> None:
        self.s = soak
        self.orphan_seen: dict[tuple[str, int, int], float] = {}
        self.held_work: set[tuple[str, int, int]] = set()  # ranks on guard-held sick nodes

    def guard_room(self, n: Node, now: float) -> bool:
        """Whether the blast-radius guard would let one more node of ``n``'s partition out
        (the same two limits as ``shared.policies.repair._guard``)."""
        part = self.s.partitions.get(f"{n.cluster_id}:{n.partition}")
        if part is None:
            return False
        allowed = max(1, math.floor(SETTINGS["max_out_of_service_fraction"]
                                    * part.total_nodes + 1e-9))
        recent = sum(1 for t in part.removed_at if now - SETTINGS["blast_window_s"] <= t <= now)
        return bool(part.down + 1 <= allowed and recent + 1 <= allowed)

    def check_held(self, n: Node, cluster_id: str, takes_out: set[str], now: float) -> None:
        """A node the guard held (SUSPECT) with a fault that takes it out must be taken out
        once the guard has room: it is diagnosed again every ``alert_reminder_s``."""
        w = self.s.watch.setdefault(n.node_id, NodeWatch())
        if n.node_id not in takes_out or not self.guard_room(n, now):
            w.room_since = None
            return
        w.room_since = w.room_since or now
        if self.s.elapsed(w.room_since, now) > HELD_BOUND_S:
            part = self.s.partitions.get(f"{n.cluster_id}:{n.partition}")
            self.s.violate(("held", n.node_id, n.since),
                           "a held node is taken out once there is room",
                           f"{n.node_id} SUSPECT (held by the blast-radius guard, alert "
                           f"{n.alert!r}) for {now - n.since:.0f} s with a fault that takes it "
                           f"out; the guard has had room for {now - w.room_since:.0f} s "
                           f"({part.down if part else '?'} of {part.total_nodes if part else '?'}"
                           f" of {cluster_id} down)")


    def check(self, nodes: dict[str, list[Node]], jobs: dict[str, Job],
                    machines: list[sqlite3.Row], faults: list[sqlite3.Row], now: float) -> None:
        owner: dict[str, str] = {}
        live_machines = {r["node_id"] for r in machines if not r["deleted"]}
        faulty = {r["node_id"] for r in faults}
        takes_out = {r["node_id"] for r in faults if r["needs"] in TAKES_NODE_OUT}
        for cluster_id, members in nodes.items():
            workers = [n for n in members if n.role is NodeRole.WORKER]
            self.s.check("no node lost")
            count = sum(1 for n in workers if n.state is not NodeState.RETIRED)
            key = ("count", cluster_id)
            w = self.s.watch.setdefault(f"cluster:{cluster_id}", NodeWatch())
            if count != self.s.expected_workers[cluster_id]:
                w.bad_count_since = w.bad_count_since or now
                if self.s.elapsed(w.bad_count_since, now) > self.s.stuck_node_s:
                    self.s.violate((*key, count), "no node lost",
                                   f"{cluster_id} has {count} worker nodes not retired, its spec "
                                   f"says {self.s.expected_workers[cluster_id]}, for "
                                   f"{now - w.bad_count_since:.0f} s")
            else:
                w.bad_count_since = None
            for n in members:
                self.s.check("no node owned by two clusters")
                if n.cluster_id != cluster_id or owner.get(n.node_id, cluster_id) != cluster_id:
                    self.s.violate(("owner", n.node_id), "no node owned by two clusters",
                                   f"{n.node_id} listed under {cluster_id} and "
                                   f"{owner.get(n.node_id, n.cluster_id)}")
                owner[n.node_id] = cluster_id
                if n.state is NodeState.RETIRED:
                    continue
                if n.role is NodeRole.WORKER and n.state is not NodeState.PROVISIONING:
                    self.s.check("no node lost")
                    if n.node_id not in live_machines:
                        self.s.violate(("machine", n.node_id), "no node lost",
                                       f"{n.node_id} is {n.state.value} in the control plane "
                                       "but has no machine in LocalCompute")
                if n.job_id:
                    job = jobs.get(n.job_id)
                    self.s.check("no node owned by two clusters")
                    if job is not None and job.cluster_id != cluster_id:
                        self.s.violate(("job-owner", n.node_id, n.job_id),
                                       "no node owned by two clusters",
                                       f"{n.node_id} of {cluster_id} runs {n.job_id} of "
                                       f"{job.cluster_id}")
                self.s.check("no node stuck")
                parked = n.node_id in self.s.operator_drained and n.state is NodeState.DRAINED
                if n.state in TRANSIENT and self.s.elapsed(n.since, now) > self.s.stuck_node_s \
                        and not parked:
                    self.s.violate(("stuck-node", n.node_id, n.since), "no node stuck",
                                   f"{n.node_id} {n.state.value} for {now - n.since:.0f} s "
                                   f"(repair {n.repair_action}, reason {n.reason!r})")
                if n.state is NodeState.SUSPECT:
                    self.s.fig.guard_holds += 1
                    self.s.check("a held node is taken out once there is room")
                    self.check_held(n, cluster_id, takes_out, now)
                self.check_drain_cause(n, faulty, now)
        for nid in live_machines - set(owner):
            self.s.check("no node lost")
            self.s.violate(("leaked", nid), "no node lost",
                           f"machine {nid} is up in LocalCompute, unknown to the control plane")

    def check_drain_cause(self, n: Node, faulty: set[str], now: float) -> None:
        """A node taken out of service had a fault the soak gave it (or one still present);
        and a drain an operator made is never undone."""
        w = self.s.watch.setdefault(n.node_id, NodeWatch())
        prev, w.last_state = w.last_state, n.state
        if n.in_service:
            if n.node_id in self.s.operator_drained:
                self.s.check("operator drains are kept")
                self.s.violate(("undrained", n.node_id), "operator drains are kept",
                               f"{n.node_id} back in service ({n.state.value}) after an "
                               "operator drain")
            w.last_in_service_since = n.since
            return
        if n.state not in OUT_OF_SERVICE or prev is None or prev not in (
                NodeState.IDLE, NodeState.ALLOCATED, NodeState.SUSPECT):
            return
        self.s.check("no drain without a fault")
        if n.node_id in faulty or w.last_fault_at >= w.last_in_service_since - CAUSE_SLACK_S \
                or n.node_id in self.s.operator_drained or n.retire_when_drained:
            return
        stale = (f"; a stale report or replayed report named it {now - w.last_stale_at:.0f} s "
                 "ago" if now - w.last_stale_at < STALE_WATCH_S else "")
        self.s.violate(("drain-cause", n.node_id, n.since), "no drain without a fault",
                       f"{n.node_id} went {prev.value} -> {n.state.value} (reason {n.reason!r}, "
                       f"diagnosis {n.last_diagnosis!r}) with no fault injected since it "
                       f"returned to service{stale}")

    def check_placement(self, nodes: dict[str, list[Node]], jobs: dict[str, Job],
                        faults: list[sqlite3.Row], workers: list[sqlite3.Row],
                        procs: dict[int, list[ProcInfo]], now: float) -> None:
        """No job starts on, or stays on, a node with an active fault that takes it out."""
        by_id = {n.node_id: n for members in nodes.values() for n in members}
        first_fault: dict[str, float] = {}
        for f in faults:
            if f["needs"] in TAKES_NODE_OUT:
                first_fault[f["node_id"]] = min(first_fault.get(f["node_id"], math.inf),
                                                f["injected_at"])
        for w in workers:
            t_f = first_fault.get(w["node_id"])
            if t_f is None:
                continue
            alive = w["exit_code"] is None and bool(procs.get(w["pid"]))
            self.s.check("no job on a node with a critical fault")
            node = by_id.get(w["node_id"])
            key = (w["job_id"], w["attempt"], w["rank"])
            if node is not None and node.state is NodeState.SUSPECT:
                # the blast-radius guard keeps it in service (policy): counted, not a fault
                self.held_work.add(key)
            if key in self.held_work:
                continue
            if w["started_at"] > t_f and \
                    self.s.elapsed(t_f, w["started_at"], blind=True) > PLACEMENT_SLACK_S:
                self.s.violate(("placed", w["job_id"], w["attempt"], w["rank"]),
                               "no job on a node with a critical fault",
                               f"{w['job_id']} attempt {w['attempt']} rank {w['rank']} started on "
                               f"{w['node_id']} {w['started_at'] - t_f:.1f} s after a fault that "
                               "takes it out of service")
            if alive and self.s.elapsed(t_f, now) > EVICT_BOUND_S:
                self.s.violate(("stays", w["job_id"], w["attempt"], w["rank"]),
                               "no job on a node with a critical fault",
                               f"{w['job_id']} attempt {w['attempt']} rank {w['rank']} still runs "
                               f"on {w['node_id']} ({node.state.value if node else '?'}) "
                               f"{now - t_f:.0f} s after a fault that takes it out of service")

    def check_gangs(self, jobs: dict[str, Job], workers: list[sqlite3.Row],
                    procs: dict[int, list[ProcInfo]], now: float,
                    parked: dict[tuple[int, int], float] | None = None) -> None:
        """One rank dead ends its gang; an ended attempt leaves no process behind. A process
        held for an in-process restart (its exit recorded as 75, its row in ``parked``) may
        outlive its attempt until its park deadline; one a later attempt took is that
        attempt's rank."""
        parked = parked or {}
        by: dict[tuple[str, int], list[sqlite3.Row]] = {}
        taken: dict[tuple[str, int, int], int] = {}  # (job, pid, start ticks) -> newest attempt
        for w in workers:
            by.setdefault((w["job_id"], w["attempt"]), []).append(w)
            key3 = (w["job_id"], w["pid"], w["start_ticks"])
            taken[key3] = max(taken.get(key3, 0), w["attempt"])
        for (job_id, attempt), ranks in by.items():
            job = jobs.get(job_id)
            running = [r for r in ranks if procs.get(r["pid"])]
            handed_on = [r for r in running if r["exit_code"] is not None and (
                taken[(job_id, r["pid"], r["start_ticks"])] > attempt
                or (r["pid"], r["start_ticks"]) in parked)]
            alive = [r for r in running if r not in handed_on]
            for r in handed_on:  # a held process no attempt took goes by its deadline
                deadline = parked.get((r["pid"], r["start_ticks"]))
                self.s.check("no orphaned worker process")
                if deadline is not None and now > deadline + ORPHAN_BOUND_S:
                    self.s.violate(("parked", job_id, attempt, r["rank"]),
                                   "no orphaned worker process",
                                   f"{job_id} attempt {attempt} rank {r['rank']}: held process "
                                   f"{r['pid']} still runs {now - deadline:.0f} s past its park "
                                   "deadline")
            dead = [r for r in ranks if r["exit_code"] not in (None, 0)
                    and r["exited_at"] is not None]
            self.s.check("a gang ends when one rank dies")
            if dead and alive:
                first = min(r["exited_at"] for r in dead)
                if self.s.elapsed(first, now) > GANG_END_BOUND_S:
                    self.s.violate(("gang", job_id, attempt), "a gang ends when one rank dies",
                                   f"{job_id} attempt {attempt}: rank(s) "
                                   f"{[r['rank'] for r in dead]} exited "
                                   f"{[r['exit_code'] for r in dead]} {now - first:.0f} s ago, "
                                   f"rank(s) {[r['rank'] for r in alive]} still run")
            over = job is None or job.terminal or attempt < job.attempt
            for r in alive:
                key = (job_id, attempt, r["rank"])
                if not over:
                    self.orphan_seen.pop(key, None)
                    continue
                seen = self.orphan_seen.setdefault(key, now)
                self.s.check("no orphaned worker process")
                if self.s.elapsed(seen, now) > ORPHAN_BOUND_S:
                    pids = [f"{p.pid}({p.state})" for p in procs.get(r["pid"], [])]
                    self.s.violate(("orphan", *key), "no orphaned worker process",
                                   f"{job_id} attempt {attempt} rank {r['rank']} "
                                   f"(job {job.state.value if job else 'gone'}, current attempt "
                                   f"{job.attempt if job else '-'}) still has processes "
                                   f"{pids} {now - seen:.0f}+ s after it ended")

    def final(self, nodes: dict[str, list[Node]], now: float) -> None:
        """After the settle time: no node left in a transient state."""
        for members in nodes.values():
            for n in members:
                self.s.check("no node stuck")
                if n.state in TRANSIENT and now - n.since > FINAL_QUIET_S:
                    self.s.violate(("unsettled", n.node_id), "no node stuck",
                                   f"{n.node_id} still {n.state.value} (since "
                                   f"{self.s.rel(n.since):.0f} s, repair {n.repair_action}) "
                                   f"{self.s.settle_s:.0f} s after the chaos ended")
