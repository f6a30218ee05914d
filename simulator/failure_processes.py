"""The failure processes: node faults, hangs and planned restarts over the simulated fleet.

They act on the same nodes and attempts as the job model, and they only *emit events* (health
reports as the node agent or the heartbeat monitor would send them, an operator's interrupt
request), never touch the control plane's store. What a fault is, how often it happens and how
it shows comes from :mod:`simulator.failures`. :class:`FailureProcesses` holds the fleet, the
job model (a fault kills the attempt on its node), the node agent (which reports the fault)
and the stragglers (a fault may slow its node instead).
"""

from __future__ import annotations

import math

from shared.domain.events import JobInterruptRequested, NodeHealthReported
from shared.domain.health import JOB_PROGRESS_SOURCE, ConditionType
from shared.policies import hangs
from simulator.agent import Agent
from simulator.clock import EPOCH_S, call_later
from simulator.failures import Fault
from simulator.fleet import Fleet
from simulator.jobs import JobModel
from simulator.stragglers import Stragglers
from simulator.streams import FAILURES_DOMAIN
from simulator.tiers import mark_gone
from simulator.world import AGENT_SOURCE, OPERATOR_SOURCE, Attempt, SimNode

HANG_CFG = hangs.HangConfig()  # the adapters' defaults
HANG_READ_S = 2.0  # the adapters read the ranks' heartbeats this often (TIER_SCAN_S)


class FailureProcesses:
    """Node faults (reported by the agent after their detection delays), hangs found in the
    ranks' progress, and planned restarts."""

    def __init__(self, fleet: Fleet, job_model: JobModel, agent: Agent,
                 stragglers: Stragglers) -> None:
        self.fleet = fleet
        self.job_model = job_model
        self.agent = agent
        self.stragglers = stragglers
        self.failing = False  # node faults start with the run, not during bring-up

    def start(self) -> None:
        """Start every node's failure clock (bring-up is taken as failure-free) and the
        scenario's scripted faults."""
        fleet = self.fleet
        self.failing = True
        for node in fleet.nodes.values():
            if node.up and not node.deleted and node.partition:
                self.start_life(node)
        for i, spec in enumerate(fleet.sc.failures.scripted):
            call_later(fleet.env, spec.at_s, self._scripted, i)

    def start_life(self, node: SimNode) -> None:
        """Schedule the node's next fault arrival from now."""
        assert node.stream is not None
        fleet = self.fleet
        node.life_token += 1
        now = float(fleet.env.now)
        life = fleet.model.lifetime_s(node.stream)
        if math.isfinite(life) and now + life < fleet.horizon:
            call_later(fleet.env, life, self._fail, node, node.life_token)

    def renew_life(self, node: SimNode) -> None:
        """A fault cleared: a Weibull lifetime starts again (an exponential node's arrivals
        never stopped; see :class:`~simulator.failures.FailureModel`)."""
        if self.fleet.model.renewing:
            self.start_life(node)

    def _fail(self, node: SimNode, token: int) -> None:
        if token != node.life_token or node.deleted:
            return
        assert node.stream is not None
        model = self.fleet.model
        fault = model.fault(node.stream, float(self.fleet.env.now))  # drawn whatever it finds
        if not model.renewing:
            self.start_life(node)  # the next arrival, whatever this one finds
        if node.up and node.fault is None:
            self._strike(node, fault)

    def _scripted(self, index: int) -> None:
        """A fault the scenario scripted at a fixed time on a fixed node slot."""
        fleet = self.fleet
        sc = fleet.sc
        spec = sc.failures.scripted[index]
        slots = fleet.by_partition.get(spec.partition or sc.cluster.partitions[0].name, [])
        node = fleet.nodes.get(slots[spec.node]) if spec.node < len(slots) else None
        if node is None or node.deleted or not node.up or node.fault is not None:
            fleet.timeline.append((float(fleet.env.now), "scripted_dropped",
                                   node.node_id if node else f"#{spec.node}", spec.cause))
            return
        cause = next(c for c in sc.failures.causes if c.name == spec.cause)
        rng = fleet.model.streams.rng(FAILURES_DOMAIN, "scripted", index)
        self._strike(node, fleet.model.fault_of(cause, float(fleet.env.now), rng, spec.variant,
                                                spec.fix))

    def _strike(self, node: SimNode, fault: Fault) -> None:
        fleet = self.fleet
        victims = [node]
        if fault.group != 1:  # a block of the partition's nodes, or (RACK_GROUP) its rack
            peers = fleet.by_partition[node.partition]
            start = (node.index // fault.group) * fault.group if fault.group else 0
            block = peers[start:start + fault.group] if fault.group \
                else fleet.by_rack.get(node.rack, [])
            for nid in block:
                peer = fleet.nodes[nid]
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
        fleet = self.fleet
        now = float(fleet.env.now)
        cause = fault.cause
        fleet.failures[cause.name] += 1
        fleet.timeline.append((now, "fault", node.node_id, cause.name))
        node.faults += 1
        node.fault_reports = 0
        if fleet.model.renewing:
            node.life_token += 1  # a Weibull age restarts when the fault clears
        att = node.attempt
        if att is not None and att.alive and not att.exited and cause.kills_job:
            att.job.truth.interruptions[cause.name] += 1
            if fault.fix != "none":  # the node leaves for a repair: its memory with it
                mark_gone(att, node.node_id)
            self.job_model.kill(att, now, cause.name, hang=cause.hang or fault.signal.node_down)
            if (cause.hang or fault.signal.node_down) and att.job.cfg.rank_progress:
                self._find_hang(node, att)
        if fault.fix == "none":
            if self.failing:
                self.renew_life(node)  # transient: nothing on the node to repair
        else:
            node.fault = fault
            fleet.fitness_changed(node)
            if cause.slows > 1.0:  # its ranks slow down until a repair clears the fault
                self.stragglers.slow_down(node, 1.0 / cause.slows)
        if not fault.signal.empty:
            self.agent.report_fault(node, fault, now)

    # -- hangs
    def _find_hang(self, node: SimNode, att: Attempt) -> None:
        """The adapters' reading of the ranks' progress (``rank_progress.RankWatch``): no rank
        progresses past the policy's threshold (its p99 is the scenario's step time), found
        at the next read of the heartbeats, and named on the node that stopped."""
        cfg = att.job.cfg
        limit = hangs.threshold([cfg.step_time_s] * HANG_CFG.min_steps, HANG_CFG)
        call_later(self.fleet.env, limit + HANG_READ_S, self._report_hang, node, att, limit)

    def _report_hang(self, node: SimNode, att: Attempt, limit: float) -> None:
        if att.exited or node.attempt is not att:
            return
        fleet = self.fleet
        now = float(fleet.env.now)
        observed = EPOCH_S + now
        rank = att.node_ids.index(node.node_id) if node.node_id in att.node_ids else None
        silent = now - (att.stopped_at or now)
        fleet.timeline.append((now, "hang found", node.node_id, att.job.job_id))
        fleet.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed, conditions=({
            "type": ConditionType.HANG_IN_JOB.value, "status": "true", "since": observed,
            "reason": f"job {att.job.job_id}: rank {rank} stopped; no rank progressed for "
                      f"{silent:.0f} s (limit {limit:.0f} s)",
            "details": {"job_id": att.job.job_id, "attempt": att.number, "culprit": rank,
                        "silent_s": silent, "threshold_s": limit}},),
            source=JOB_PROGRESS_SOURCE), AGENT_SOURCE)

    # -- planned restarts
    def start_planned(self) -> None:
        if self.fleet.sc.failures.planned.rate_per_day > 0:
            self._next_planned()

    def _next_planned(self) -> None:
        fleet = self.fleet
        cfg = fleet.sc.failures.planned
        mean = 86_400.0 / cfg.rate_per_day
        gap = mean if cfg.periodic else float(fleet.rng.exponential(mean))
        call_later(fleet.env, gap, self._planned)

    def _planned(self) -> None:
        fleet = self.fleet
        self._next_planned()
        for job in fleet.jobs.values():
            att = job.attempt
            if att is None or not att.alive or att.exited or att.stopped_at is not None:
                continue
            fleet.planned += 1
            job.truth.interruptions["planned_maintenance"] += 1
            fleet.timeline.append((float(fleet.env.now), "planned", job.job_id, ""))
            fleet.emit(JobInterruptRequested(job_id=job.job_id, attempt=att.number,
                                             node_id=att.node_ids[0],
                                             reason="planned_maintenance: scheduled restart"),
                       OPERATOR_SOURCE)
