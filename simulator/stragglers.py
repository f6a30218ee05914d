"""Stragglers: nodes whose ranks run slower, and the pace of the gangs on them.

The failure model's stragglers (``failures.stragglers``) arrive at a fleet-wide rate, pick a
node uniformly among those that may straggle, slow it by a drawn ratio for a drawn duration
and are reported by the node's speed check; a fault of a cause with ``slows`` slows its node
until a repair clears it. An attempt runs at the pace of its slowest node (a scale-down at
its share of the global batch); when that pace changes, its checkpoints and its end move with
it. :class:`Stragglers` holds the fleet, the job model and slow-in-job.
"""

from __future__ import annotations

from shared.domain.events import NodeHealthReported
from simulator.clock import EPOCH_S, call_later
from simulator.fleet import Fleet
from simulator.jobs import JobModel
from simulator.slow_in_job import SlowInJob
from simulator.world import AGENT_SOURCE, Attempt, SimNode


class Stragglers:
    """Straggler arrivals and reports, and each attempt's pace (see the module)."""

    def __init__(self, fleet: Fleet, job_model: JobModel, slow: SlowInJob) -> None:
        self.fleet = fleet
        self.job_model = job_model
        self.slow = slow

    def start(self) -> None:
        cfg = self.fleet.sc.failures.stragglers
        if cfg.rate_per_node_day > 0:
            self._next()

    def _next(self) -> None:
        fleet = self.fleet
        cfg = fleet.sc.failures.stragglers
        up = max(1, len(fleet.nodes))
        rate_per_s = cfg.rate_per_node_day * up / 86_400.0
        call_later(fleet.env, float(fleet.rng.exponential(1.0 / rate_per_s)), self._straggle)

    def _straggle(self) -> None:
        fleet = self.fleet
        cfg = fleet.sc.failures.stragglers
        self._next()
        node = self.draw()
        if node is None:
            return
        ratio = min(0.99, cfg.ratio.sample(fleet.rng))
        fleet.stragglers[node.node_id] = ratio
        node.straggle = ratio
        fleet.fitness_changed(node)
        fleet.timeline.append((float(fleet.env.now), "straggler", node.node_id, f"{ratio:.2f}"))
        self.refactor(node)
        until = float(fleet.env.now) + cfg.duration.sample(fleet.rng)
        delay = fleet.sc.detection["speed"].sample(fleet.rng)
        call_later(fleet.env, delay, self._report, node, ratio, until)
        call_later(fleet.env, until - float(fleet.env.now), self._end, node, ratio)

    def draw(self) -> SimNode | None:
        """Uniform over the nodes that may straggle, in fleet order: the k-th of them from
        a Fenwick tree, not a list of the whole fleet per draw (None: no node may)."""
        fleet = self.fleet
        if len(fleet.drawable) != len(fleet.nodes):  # a fleet not built through enlist
            fleet.reindex()
        drawable = fleet.drawable
        if not drawable.count:
            return None
        return fleet.fleet_order[drawable.kth(int(fleet.rng.integers(drawable.count)))]

    def _report(self, node: SimNode, ratio: float, until: float) -> None:
        fleet = self.fleet
        if fleet.stragglers.get(node.node_id) != ratio or node.deleted:
            return
        observed = EPOCH_S + float(fleet.env.now)
        cond = {"type": "SlowSpeedCheck", "status": "true", "reason": "slow speed check",
                "since": observed, "details": {"ratio_to_baseline": ratio,
                                               "cause": "straggler"}}
        fleet.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                      conditions=(cond,)), AGENT_SOURCE)
        nxt = fleet.sc.failures.stragglers.report_interval_s
        if float(fleet.env.now) + nxt < until:
            call_later(fleet.env, nxt, self._report, node, ratio, until)

    def _end(self, node: SimNode, ratio: float) -> None:
        fleet = self.fleet
        if fleet.stragglers.get(node.node_id) == ratio:
            del fleet.stragglers[node.node_id]
            node.straggle = 1.0
            fleet.fitness_changed(node)
            self.refactor(node)

    def slow_down(self, node: SimNode, speed: float) -> None:
        """A fault that slows its node's ranks (a cause with ``slows``), until a repair."""
        fleet = self.fleet
        fleet.stragglers[node.node_id] = speed
        node.straggle = speed
        fleet.fitness_changed(node)
        fleet.timeline.append((float(fleet.env.now), "slowed", node.node_id, f"{speed:.2f}"))
        self.refactor(node)

    def pace(self, att: Attempt) -> float:
        """The pace of an attempt's gang: its slowest straggler's ratio (1.0: none
        straggles), read from whichever is smaller, the gang or the stragglers."""
        if att.scale != 1.0:  # a scale-down: fewer replicas, the same global batch
            return att.scale * self._slowest_node(att)
        return self._slowest_node(att)

    def _slowest_node(self, att: Attempt) -> float:
        stragglers = self.fleet.stragglers
        if not stragglers:
            return 1.0
        if len(stragglers) < len(att.node_ids):
            job = att.job  # (the latest attempt's nodes are its job's gang: no set to build)
            members = job.gang if att is job.attempt else att.members
            return min((r for n, r in stragglers.items() if n in members), default=1.0)
        return min((r for r in map(stragglers.get, att.node_ids) if r is not None),
                   default=1.0)

    def refactor(self, node: SimNode) -> None:
        """The node's pace changed: so may its attempt's (its end and checkpoints move)."""
        att = node.attempt
        if att is None or att.exited or not att.alive or att.stopped_at is not None:
            return
        self.slow.watch(att)  # a job with per-rank progress sees its slowed ranks
        factor = self.pace(att)
        if att.factors and att.factors[-1][1] == factor:
            return
        att.factors.append((float(self.fleet.env.now), factor))
        if att.job.cfg.work_s is not None:
            att.token += 1
            self.job_model.plan_completion(att)
            if self.fleet.sc.checkpoint_events == "all":
                self.job_model.rearm_checkpoints(att)
