"""The simulated machines' lifecycle: provisioning, deletion and repairs on SimPy time.

Provisioning and reset / reboot / reimage / replace complete after sampled durations (the
keyed streams: one node's times do not shift another's) and answer with ``NodeProvisioned`` /
``NodeRepairCompleted``; then the node's agent runs its post-repair checks, which tell the
truth: a repair cheaper than the fault's true fix does not clear it. A request repeated for
the same key (node; node and repair attempt) is a no-op. :class:`Machines` holds the fleet,
the job model (a deleted node's attempt dies), the agent, the failure processes (a new or
repaired node's failure clock) and the capacity (queue waits, new spot VMs, the meter).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.domain.events import NodeProvisioned, NodeRepairCompleted
from shared.domain.health import RepairAction
from shared.domain.model import Node, NodeRole
from simulator.agent import Agent
from simulator.capacity import Capacity
from simulator.clock import call_later
from simulator.failure_processes import FailureProcesses
from simulator.failures import repair_fixes
from simulator.fleet import Fleet
from simulator.jobs import JobModel
from simulator.streams import FAILURES_DOMAIN, PROVISION_DOMAIN, REPAIR_DOMAIN
from simulator.tiers import mark_gone
from simulator.world import SimNode


class Machines:
    """Nodes provisioned, deleted and repaired (see the module)."""

    def __init__(self, fleet: Fleet, job_model: JobModel, agent: Agent,
                 failures: FailureProcesses, capacity: Capacity) -> None:
        self.fleet = fleet
        self.job_model = job_model
        self.agent = agent
        self.failures = failures
        self.capacity = capacity
        self._provisioning: set[str] = set()

    def provision_nodes(self, nodes: Sequence[Node]) -> None:
        """``provision_node`` for each node, in order, with the new nodes' boot-time and
        failure streams seeded together first (``Streams.seed_many``: the same numbers)."""
        fleet = self.fleet
        fresh = list(dict.fromkeys(n.node_id for n in nodes if n.node_id not in self._provisioning
                                   and n.node_id not in fleet.nodes))
        streams = fleet.model.streams
        streams.seed_many(PROVISION_DOMAIN, fresh)
        streams.seed_many(FAILURES_DOMAIN, fresh)
        for node in nodes:
            self.provision_node(node)

    def provision_node(self, node: Node) -> None:
        fleet = self.fleet
        if node.node_id in self._provisioning or node.node_id in fleet.nodes:
            return
        self._provisioning.add(node.node_id)
        sc = fleet.sc
        replacement = node.replaces is not None
        rng = fleet.model.streams.rng(PROVISION_DOMAIN, node.node_id)
        if replacement:
            took = 0.0 if sc.repair.instant else sc.repair.durations["replace"].sample(rng)
        else:
            took = sc.cluster.provision.sample(rng)
        # waiting for capacity (a queue's grant, a new spot VM) is not billed; booting is
        unbilled = self.capacity.arrival_wait(node.replaces)
        obtain = self.capacity.replacement_time(node.replaces)
        if obtain is not None:  # a new VM for a preempted one, not a hardware swap
            unbilled += obtain
            took = sc.cluster.provision.sample(rng)
        if node.role is NodeRole.WORKER:  # GPU nodes, spares included (not a login VM)
            self.capacity.meter.start(node.node_id, float(fleet.env.now) + unbilled)
        took += unbilled
        call_later(fleet.env, took, self._provisioned, node.node_id, node.partition,
                   node.role is NodeRole.WORKER, replacement, node.rack)

    def _provisioned(self, node_id: str, partition: str, worker: bool, replacement: bool,
                     rack: str = "") -> None:
        fleet = self.fleet
        index = len(fleet.by_partition[partition])
        stream = fleet.model.node_stream(node_id, replacement=replacement)
        node = SimNode(node_id, partition, index, stream.multiplier, up=True,
                       replacement=replacement, stream=stream, rack=rack)
        if rack and worker:
            fleet.by_rack[rack].append(node_id)
        fleet.nodes[node_id] = node
        fleet.enlist(node)
        self._provisioning.discard(node_id)
        fleet.emit(NodeProvisioned(node_id=node_id))
        if not worker:
            return
        fleet.by_partition[partition].append(node_id)
        if replacement:
            fleet.repairs_done["replace"] += 1
            fleet.timeline.append((float(fleet.env.now), "replaced", node_id, ""))
        if self.failures.failing:
            self.failures.start_life(node)
            self.capacity.arm(node)
        self.agent.verify(node)

    def delete_node(self, node_id: str) -> None:
        fleet = self.fleet
        node = fleet.nodes.get(node_id)
        if node is None or node.deleted:
            return
        now = float(fleet.env.now)
        node.deleted = True
        node.up = False
        self.capacity.meter.stop(node_id, now)
        node.life_token += 1
        node.verify_token += 1
        fleet.stragglers.pop(node_id, None)
        fleet.fitness_changed(node)
        if node.attempt is not None and node.attempt.alive:
            mark_gone(node.attempt, node_id)
            self.job_model.kill(node.attempt, now, "node deleted", hang=False)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        fleet = self.fleet
        if not fleet.ledger.start_repair(node_id, attempt, RepairAction(action).value,
                                         float(fleet.env.now)):
            return
        node = fleet.nodes.get(node_id)
        if node is None:
            return
        node.verify_token += 1
        node.repairing = True
        node.repairs += 1
        # keyed by (node, repair number): other repairs' durations do not shift this one's
        rng = fleet.model.streams.rng(REPAIR_DOMAIN, node_id, node.repairs)
        repair = fleet.sc.repair
        instant = repair.instant
        took = 0.0 if instant else repair.durations[action.value].sample(rng)
        mech_ok = instant or rng.random() >= repair.mechanical_failure.get(action.value, 0.0)
        fleet.timeline.append((float(fleet.env.now), "repair", node_id, action.value))
        call_later(fleet.env, took, self._repaired, node, action, attempt, mech_ok)

    def _repaired(self, node: SimNode, action: RepairAction, attempt: int,
                  mech_ok: bool) -> None:
        node.repairing = False
        if node.deleted:
            return
        fleet = self.fleet
        fault = node.fault
        # an instant repair (scenario ``repair.instant``) clears whatever the fault was
        fixes = fault is None or fleet.sc.repair.instant or repair_fixes(action, fault.fix)
        if fault is not None and fault.signal.node_down and not fixes:
            ok, detail = False, f"node did not come back after {action.value}"
        elif not mech_ok:
            ok, detail = False, f"{action.value} failed"
        else:
            ok, detail = True, ""
            fleet.repairs_done[action.value] += 1
            if fixes:
                node.fault = None
                if fleet.stragglers.pop(node.node_id, None) is not None:
                    node.straggle = 1.0
                fleet.fitness_changed(node)
                if self.failures.failing:
                    self.failures.renew_life(node)
        fleet.emit(NodeRepairCompleted(node_id=node.node_id, action=action.value,
                                       attempt=attempt, ok=ok, detail=detail))
        if ok:
            self.agent.verify(node)
