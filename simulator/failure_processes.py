"""The failure processes: node faults, stragglers and planned restarts over the simulated fleet.

They act on the same nodes and attempts as the job model, and they only *emit events* (health
reports as the node agent or the heartbeat monitor would send them, an operator's interrupt
request), never touch the control plane's store. What a fault is, how often it happens and how
it shows comes from :mod:`simulator.failures`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shared.domain.events import JobInterruptRequested, NodeHealthReported
from shared.domain.health import JOB_PROGRESS_SOURCE, ConditionType
from shared.policies import hangs
from shared.policies.preflight import PreflightPlan, PreflightResult
from simulator import preflight_model
from simulator.clock import EPOCH_S, call_later
from simulator.failures import (
    FailureModel,
    Fault,
    fault_conditions,
    healthy_conditions,
)
from simulator.jobs import JobModel
from simulator.picking import Qualifying
from simulator.slow_in_job import watch
from simulator.streams import DETECT_DOMAIN, FAILURES_DOMAIN
from simulator.tiers import mark_gone
from simulator.world import AGENT_SOURCE, OPERATOR_SOURCE, Attempt, SimNode

HANG_CFG = hangs.HangConfig()  # the adapters' defaults
HANG_READ_S = 2.0  # the adapters read the ranks' heartbeats this often (TIER_SCAN_S)


class FailureProcesses(JobModel):
    """Node faults (with their detection delays), stragglers and planned restarts."""

    model: FailureModel
    rng: np.random.Generator
    heartbeat_timeout_s: float
    by_partition: dict[str, list[str]]
    by_rack: dict[str, list[str]]
    stragglers: dict[str, float]
    preflight_until: dict[str, float]  # job -> when the preflight run for its start ends
    slow_seen: set[tuple[str, int, str, float]]  # SlowInJob scheduled (job, attempt, node, r)
    failures: dict[str, int]
    timeline: list[tuple[float, str, str, str]]
    failing: bool
    planned: int
    unfit: set[str]  # deleted, down or with a fault that blocks a launch (fitness_changed)
    drawable: Qualifying  # by fleet position: may become a straggler (fitness_changed)
    positions: dict[str, int]
    fleet_order: list[SimNode]  # the nodes in the order the fleet gained them

    def fitness_changed(self, node: SimNode) -> None:
        """Keep ``unfit`` (the nodes no attempt can launch on) and ``drawable`` (those that may
        become stragglers) up to date: called wherever a node goes down, is deleted, gains or
        loses a fault, or starts or stops straggling."""
        fault = node.fault
        if node.deleted or not node.up or (fault is not None and fault.signal.blocks_launch):
            self.unfit.add(node.node_id)
        else:
            self.unfit.discard(node.node_id)
        at = self.positions.get(node.node_id)
        if at is not None:
            self.drawable.set(at, self._drawable(node))

    def enlist(self, node: SimNode) -> None:
        """A node joins the fleet, last in its order."""
        self.positions[node.node_id] = self.drawable.append(self._drawable(node))
        self.fleet_order.append(node)

    def _reindex(self) -> None:
        self.drawable, self.positions, self.fleet_order = Qualifying(), {}, []
        for node in self.nodes.values():
            self.enlist(node)

    def _drawable(self, node: SimNode) -> bool:
        return node.up and not node.deleted and node.node_id not in self.stragglers \
            and bool(node.partition)

    def start_failures(self) -> None:
        """Start every node's failure clock (bring-up is taken as failure-free) and the
        scenario's scripted faults."""
        self.failing = True
        for node in self.nodes.values():
            if node.up and not node.deleted and node.partition:
                self._start_life(node)
        for i, spec in enumerate(self.sc.failures.scripted):
            call_later(self.env, spec.at_s, self._scripted, i)

    def _start_life(self, node: SimNode) -> None:
        """Schedule the node's next fault arrival from now."""
        assert node.stream is not None
        node.life_token += 1
        now = float(self.env.now)
        life = self.model.lifetime_s(node.stream)
        if math.isfinite(life) and now + life < self.horizon:
            call_later(self.env, life, self._fail, node, node.life_token)

    def _renew_life(self, node: SimNode) -> None:
        """A fault cleared: a Weibull lifetime starts again (an exponential node's arrivals
        never stopped; see :class:`~simulator.failures.FailureModel`)."""
        if self.model.renewing:
            self._start_life(node)

    def _fail(self, node: SimNode, token: int) -> None:
        if token != node.life_token or node.deleted:
            return
        assert node.stream is not None
        fault = self.model.fault(node.stream, float(self.env.now))  # drawn whatever it finds
        if not self.model.renewing:
            self._start_life(node)  # the next arrival, whatever this one finds
        if node.up and node.fault is None:
            self._strike(node, fault)

    def _scripted(self, index: int) -> None:
        """A fault the scenario scripted at a fixed time on a fixed node slot."""
        spec = self.sc.failures.scripted[index]
        slots = self.by_partition.get(spec.partition or self.sc.cluster.partitions[0].name, [])
        node = self.nodes.get(slots[spec.node]) if spec.node < len(slots) else None
        if node is None or node.deleted or not node.up or node.fault is not None:
            self.timeline.append((float(self.env.now), "scripted_dropped",
                                  node.node_id if node else f"#{spec.node}", spec.cause))
            return
        cause = next(c for c in self.sc.failures.causes if c.name == spec.cause)
        rng = self.model.streams.rng(FAILURES_DOMAIN, "scripted", index)
        self._strike(node, self.model.fault_of(cause, float(self.env.now), rng, spec.variant,
                                               spec.fix))

    def _strike(self, node: SimNode, fault: Fault) -> None:
        victims = [node]
        if fault.group != 1:  # a block of the partition's nodes, or (RACK_GROUP) its rack
            peers = self.by_partition[node.partition]
            start = (node.index // fault.group) * fault.group if fault.group else 0
            block = peers[start:start + fault.group] if fault.group \
                else self.by_rack.get(node.rack, [])
            for nid in block:
                peer = self.nodes[nid]
                if peer is not node and peer.up and not peer.deleted and peer.fault is None:
                    victims.append(peer)
        if fault.fix != "none" and fault.cause.kills_job:  # every victim's memory goes (tiers)
            for victim in victims:
                att = victim.attempt
                if att is not None and att.alive and not att.exited:
                    mark_gone(att, victim.node_id)
        for victim in victims:
            self.apply_fault(victim, fault)

    def apply_fault(self, node: SimNode, fault: Fault) -> None:
        now = float(self.env.now)
        cause = fault.cause
        self.failures[cause.name] += 1
        self.timeline.append((now, "fault", node.node_id, cause.name))
        node.faults += 1
        node.fault_reports = 0
        if self.model.renewing:
            node.life_token += 1  # a Weibull age restarts when the fault clears
        att = node.attempt
        if att is not None and att.alive and not att.exited and cause.kills_job:
            att.job.truth.interruptions[cause.name] += 1
            if fault.fix != "none":  # the node leaves for a repair: its memory with it
                mark_gone(att, node.node_id)
            self._kill(att, now, cause.name, hang=cause.hang or fault.signal.node_down)
            if (cause.hang or fault.signal.node_down) and att.job.cfg.rank_progress:
                self._find_hang(node, att)
        if fault.fix == "none":
            if self.failing:
                self._renew_life(node)  # transient: nothing on the node to repair
        else:
            node.fault = fault
            self.fitness_changed(node)
            if cause.slows > 1.0:  # its ranks slow down until a repair clears the fault
                self._slow_down(node, 1.0 / cause.slows)
        if not fault.signal.empty:
            self._report_fault(node, fault, now)

    def _slow_down(self, node: SimNode, speed: float) -> None:
        self.stragglers[node.node_id] = speed
        node.straggle = speed
        self.fitness_changed(node)
        self.timeline.append((float(self.env.now), "slowed", node.node_id, f"{speed:.2f}"))
        self._refactor(node)

    def run_preflight(self, job_id: str, node_ids: Sequence[str], plan: PreflightPlan
                      ) -> PreflightResult:
        """The Preflight port, priced (``simulator.preflight_model``)."""
        return preflight_model.run(self, self.sc.cluster.preflight, job_id, node_ids, plan)

    def _find_hang(self, node: SimNode, att: Attempt) -> None:
        """The adapters' reading of the ranks' progress (``rank_progress.RankWatch``): no rank
        progresses past the policy's threshold (its p99 is the scenario's step time), found
        at the next read of the heartbeats, and named on the node that stopped."""
        cfg = att.job.cfg
        limit = hangs.threshold([cfg.step_time_s] * HANG_CFG.min_steps, HANG_CFG)
        call_later(self.env, limit + HANG_READ_S, self._report_hang, node, att, limit)

    def _report_hang(self, node: SimNode, att: Attempt, limit: float) -> None:
        if att.exited or node.attempt is not att:
            return
        observed = EPOCH_S + float(self.env.now)
        rank = att.node_ids.index(node.node_id) if node.node_id in att.node_ids else None
        silent = float(self.env.now) - (att.stopped_at or float(self.env.now))
        self.timeline.append((float(self.env.now), "hang found", node.node_id, att.job.job_id))
        self.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed, conditions=({
            "type": ConditionType.HANG_IN_JOB.value, "status": "true", "since": observed,
            "reason": f"job {att.job.job_id}: rank {rank} stopped; no rank progressed for "
                      f"{silent:.0f} s (limit {limit:.0f} s)",
            "details": {"job_id": att.job.job_id, "attempt": att.number, "culprit": rank,
                        "silent_s": silent, "threshold_s": limit}},),
            source=JOB_PROGRESS_SOURCE), AGENT_SOURCE)

    def _report_fault(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        """Report ``fault`` after its detection delay; ``fault_at`` is the condition's
        ``since`` (when the fault happened, whoever notices it and when)."""
        signal = fault.signal
        rng = self.model.streams.rng(DETECT_DOMAIN, node.node_id, node.faults, node.fault_reports)
        node.fault_reports += 1
        delay = self.sc.detection[signal.detection].sample(rng)
        if signal.heartbeat:
            delay += self.heartbeat_timeout_s
        call_later(self.env, delay, self._send_fault_report, node, fault, fault_at)

    def _send_fault_report(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        if node.deleted or (node.fault is not fault and fault.fix != "none"):
            return  # repaired (or replaced) before anyone noticed
        self._emit_fault(node, fault, fault_at)
        if node.reporting is not fault:  # the condition persists: the agent says so again
            node.reporting = fault
            call_later(self.env, self.sc.report_interval_s, self._still_broken, node, fault,
                       fault_at)

    def _emit_fault(self, node: SimNode, fault: Fault, fault_at: float,
                    source: str | None = None) -> None:
        observed = EPOCH_S + float(self.env.now)
        self.emit(NodeHealthReported(
            node_id=node.node_id, observed_at=observed,
            conditions=fault_conditions(fault.signal, EPOCH_S + fault_at, observed,
                                        fault.cause.name),
            source=source or ("heartbeat-monitor" if fault.signal.heartbeat else "agent")),
            AGENT_SOURCE)

    def _still_broken(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        """The agent's next periodic report: a fault that is still there is reported again
        (so a repair the blast-radius guard held is planned again once the guard allows it:
        without it the node was lost for the rest of the run); a transient one that has
        cleared is reported healthy, once (which releases a node held for it). During a
        repair the agent is silent and the post-repair checks report instead."""
        if node.deleted or node.reporting is not fault:
            return
        if node.fault is fault:
            if not node.repairing:
                self._emit_fault(node, fault, fault_at)
            call_later(self.env, self.sc.report_interval_s, self._still_broken, node, fault,
                       fault_at)
            return
        node.reporting = None
        if fault.fix == "none" and node.fault is None and not node.repairing:
            observed = EPOCH_S + float(self.env.now)
            self.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                         conditions=healthy_conditions(observed)),
                      AGENT_SOURCE)

    def start_stragglers(self) -> None:
        cfg = self.sc.failures.stragglers
        if cfg.rate_per_node_day > 0:
            self._next_straggler()

    def _next_straggler(self) -> None:
        cfg = self.sc.failures.stragglers
        up = max(1, len(self.nodes))
        rate_per_s = cfg.rate_per_node_day * up / 86_400.0
        call_later(self.env, float(self.rng.exponential(1.0 / rate_per_s)), self._straggle)

    def _straggle(self) -> None:
        cfg = self.sc.failures.stragglers
        self._next_straggler()
        node = self._draw_straggler()
        if node is None:
            return
        ratio = min(0.99, cfg.ratio.sample(self.rng))
        self.stragglers[node.node_id] = ratio
        node.straggle = ratio
        self.fitness_changed(node)
        self.timeline.append((float(self.env.now), "straggler", node.node_id, f"{ratio:.2f}"))
        self._refactor(node)
        until = float(self.env.now) + cfg.duration.sample(self.rng)
        delay = self.sc.detection["speed"].sample(self.rng)
        call_later(self.env, delay, self._straggle_report, node, ratio, until)
        call_later(self.env, until - float(self.env.now), self._straggle_end, node, ratio)

    def _draw_straggler(self) -> SimNode | None:
        """Uniform over the nodes that may straggle, in fleet order: the k-th of them from
        a Fenwick tree, not a list of the whole fleet per draw (None: no node may)."""
        if len(self.drawable) != len(self.nodes):  # a fleet not built through enlist (tests)
            self._reindex()
        drawable = self.drawable
        if not drawable.count:
            return None
        return self.fleet_order[drawable.kth(int(self.rng.integers(drawable.count)))]

    def _straggle_report(self, node: SimNode, ratio: float, until: float) -> None:
        if self.stragglers.get(node.node_id) != ratio or node.deleted:
            return
        observed = EPOCH_S + float(self.env.now)
        cond = {"type": "SlowSpeedCheck", "status": "true", "reason": "slow speed check",
                "since": observed, "details": {"ratio_to_baseline": ratio,
                                               "cause": "straggler"}}
        self.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                     conditions=(cond,)), AGENT_SOURCE)
        nxt = self.sc.failures.stragglers.report_interval_s
        if float(self.env.now) + nxt < until:
            call_later(self.env, nxt, self._straggle_report, node, ratio, until)

    def _straggle_end(self, node: SimNode, ratio: float) -> None:
        if self.stragglers.get(node.node_id) == ratio:
            del self.stragglers[node.node_id]
            node.straggle = 1.0
            self.fitness_changed(node)
            self._refactor(node)

    def _slowest(self, att: Attempt) -> float:
        """The pace of an attempt's gang: its slowest straggler's ratio (1.0: none
        straggles), read from whichever is smaller, the gang or the stragglers."""
        if att.scale != 1.0:  # a scale-down: fewer replicas, the same global batch
            return att.scale * self._slowest_node(att)
        return self._slowest_node(att)

    def _slowest_node(self, att: Attempt) -> float:
        stragglers = self.stragglers
        if not stragglers:
            return 1.0
        if len(stragglers) < len(att.node_ids):
            job = att.job  # (the latest attempt's nodes are its job's gang: no set to build)
            members = job.gang if att is job.attempt else att.members
            return min((r for n, r in stragglers.items() if n in members), default=1.0)
        return min((r for r in map(stragglers.get, att.node_ids) if r is not None),
                   default=1.0)

    def _refactor(self, node: SimNode) -> None:
        att = node.attempt
        if att is None or att.exited or not att.alive or att.stopped_at is not None:
            return
        watch(self, att)  # a job with per-rank progress sees its slowed ranks
        factor = self._slowest(att)
        if att.factors and att.factors[-1][1] == factor:
            return
        att.factors.append((float(self.env.now), factor))
        if att.job.cfg.work_s is not None:
            att.token += 1
            self._plan_completion(att)
            if self.sc.checkpoint_events == "all":
                self._rearm_checkpoints(att)

    def start_planned(self) -> None:
        if self.sc.failures.planned.rate_per_day > 0:
            self._next_planned()

    def _next_planned(self) -> None:
        cfg = self.sc.failures.planned
        mean = 86_400.0 / cfg.rate_per_day
        gap = mean if cfg.periodic else float(self.rng.exponential(mean))
        call_later(self.env, gap, self._planned)

    def _planned(self) -> None:
        self._next_planned()
        for job in self.jobs.values():
            att = job.attempt
            if att is None or not att.alive or att.exited or att.stopped_at is not None:
                continue
            self.planned += 1
            job.truth.interruptions["planned_maintenance"] += 1
            self.timeline.append((float(self.env.now), "planned", job.job_id, ""))
            self.emit(JobInterruptRequested(job_id=job.job_id, attempt=att.number,
                                            node_id=att.node_ids[0],
                                            reason="planned_maintenance: scheduled restart"),
                      OPERATOR_SOURCE)
