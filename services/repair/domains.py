"""Repair's half of racks as a unit of failure: read a rack, drain it as one
(policy: shared.policies.domains, decided in shared.policies.repair_decision).

The rack's state (drained, held) lives on the partition aggregate, so a redelivered or
reordered diagnosis finds the rack drained already and neither drains nor alerts twice; the
rack is whole again when its last node is back in service (``Partition.put_back``).
"""

from __future__ import annotations

from collections.abc import Callable

from shared.domain.events import DomainDrained
from shared.domain.health import RepairAction
from shared.domain.model import IN_SERVICE, Node, NodeState, Partition
from shared.handling import Deps
from shared.policies.domains import DOMAIN_ACTION, DomainView
from shared.policies.repair_decision import RepairStep
from shared.ports import UnitOfWork

TakeOut = Callable[[Node, Partition, RepairAction, str, UnitOfWork, Deps], None]


def bad(node: Node) -> bool:
    """Counts toward its rack's bad share: out of service, held, or with an active fault."""
    return node.state not in IN_SERVICE or node.state is NodeState.SUSPECT or bool(node.fault)


def members(node: Node, uow: UnitOfWork) -> list[Node]:
    """The nodes of ``node``'s rack in its partition that have not left for good."""
    return [n for n in uow.nodes.list(node.cluster_id, rack=node.rack)
            if n.state is not NodeState.RETIRED and n.partition == node.partition]


def view(node: Node, partition: Partition, uow: UnitOfWork) -> DomainView:
    """What the decision needs to know about ``node``'s rack now."""
    rack = members(node, uow)
    return DomainView(node.rack, frozenset(n.node_id for n in rack),
                      frozenset(n.node_id for n in rack if bad(n)),
                      node.rack in partition.drained_domains, len(partition.drained_domains))


def hold(node: Node, partition: Partition, rack: DomainView, reason: str, uow: UnitOfWork
         ) -> None:
    """The guard per domain holds the rack: its one alert (its nodes go per node)."""
    if partition.hold_domain(node.rack):
        ids = tuple(sorted(rack.node_ids))
        uow.emit(DomainDrained(cluster_id=node.cluster_id, partition=partition.name,
                               domain=node.rack, node_ids=ids, reason=reason, held=True))


def drain(node: Node, step: RepairStep, partition: Partition, uow: UnitOfWork, deps: Deps,
          take_out: TakeOut) -> None:
    """Drain ``node``'s rack as one: the node takes ``step.action``, the rack's others in
    service a reboot; one removal against the partition's guard, one alert."""
    assert step.action is not None
    rack = members(node, uow)
    partition.drain_domain(node.rack, [n.node_id for n in rack
                                       if n.state in IN_SERVICE or n.node_id == node.node_id
                                       or n.node_id in partition.out_of_service])
    before = len(partition.removed_at)
    for member in rack:  # the diagnosed node first, the others in id order
        if member.node_id != node.node_id and member.state not in IN_SERVICE:
            continue  # already out (verifying, repairing) or coming up: its own course stands
        action = step.action if member.node_id == node.node_id else DOMAIN_ACTION
        take_out(member, partition, action, step.reason, uow, deps)
    kept = min(before, len(partition.removed_at))  # (take_out drops entries past the window)
    partition.removed_at = partition.removed_at[:kept + 1]  # one shared cause: one removal
    uow.emit(DomainDrained(cluster_id=node.cluster_id, partition=partition.name,
                           domain=node.rack, node_ids=tuple(sorted(n.node_id for n in rack)),
                           reason=step.reason))
