"""Repair's half of racks as a unit of failure: drain a rack as one (shared.policies.domains).

Called by ``on_diagnosed`` before the per-node decision. The rack's state (drained, held)
lives on the partition aggregate, so a redelivered or reordered diagnosis finds the rack
drained already and neither drains nor alerts twice; the rack is whole again when its last
node is back in service (``Partition.put_back``).
"""

from __future__ import annotations

from collections.abc import Callable

from shared.domain import lifecycle
from shared.domain.events import DomainDrained
from shared.domain.health import Diagnosis, FailureRecord, RepairAction
from shared.domain.model import IN_SERVICE, Node, NodeState, Partition
from shared.handling import Deps
from shared.policies.domains import DomainDecisionKind, DomainView, plan_domain
from shared.policies.ranking import action_rank
from shared.ports import UnitOfWork

TakeOut = Callable[[Node, Partition, RepairAction, str, UnitOfWork, Deps], None]
# what the rack's other nodes get: a power cycle once the shared part is fixed
DOMAIN_ACTION = RepairAction.REBOOT


def bad(node: Node) -> bool:
    """Counts toward its rack's bad share: out of service, held, or with an active fault."""
    return node.state not in IN_SERVICE or node.state is NodeState.SUSPECT or bool(node.fault)


def drain_if_rack_failed(node: Node, diagnosis: Diagnosis, partition: Partition,
                         uow: UnitOfWork, deps: Deps, take_out: TakeOut) -> bool:
    """Drain ``node``'s rack as one when policy says so; True when done (the per-node
    decision is then skipped). A held rack returns False: its nodes go per node."""
    config = deps.config.repair
    if config.domain_drain_fraction <= 0 or not node.rack \
            or not diagnosis.action.takes_node_out:
        return False
    members = [n for n in uow.nodes.list(node.cluster_id, rack=node.rack)
               if n.state is not NodeState.RETIRED and n.partition == node.partition]
    view = DomainView(node.rack, frozenset(n.node_id for n in members),
                      frozenset(n.node_id for n in members if bad(n)),
                      node.rack in partition.drained_domains, len(partition.drained_domains))
    decision = plan_domain(view, node.node_id, config)
    if decision.kind is DomainDecisionKind.NONE:
        return False
    ids = tuple(sorted(view.node_ids))
    if decision.kind is DomainDecisionKind.HOLD:
        if partition.hold_domain(node.rack):
            uow.emit(DomainDrained(cluster_id=node.cluster_id, partition=partition.name,
                                   domain=node.rack, node_ids=ids, reason=decision.reason,
                                   held=True))
        return False
    partition.drain_domain(node.rack, [n.node_id for n in members
                                       if n.state in IN_SERVICE or n.node_id == node.node_id
                                       or n.node_id in partition.out_of_service])
    now = deps.clock.now()
    own = diagnosis.action if action_rank(diagnosis.action) >= action_rank(DOMAIN_ACTION) \
        else DOMAIN_ACTION
    lifecycle.record_failure(node, FailureRecord(now, diagnosis.failure_mode, own))
    before = len(partition.removed_at)
    for member in members:  # the diagnosed node first, the others in id order
        if member.node_id != node.node_id and member.state not in IN_SERVICE:
            continue  # already out (verifying, repairing) or coming up: its own course stands
        action = own if member.node_id == node.node_id else DOMAIN_ACTION
        take_out(member, partition, action, decision.reason, uow, deps)
    kept = min(before, len(partition.removed_at))  # (take_out drops entries past the window)
    partition.removed_at = partition.removed_at[:kept + 1]  # one shared cause: one removal
    uow.emit(DomainDrained(cluster_id=node.cluster_id, partition=partition.name,
                           domain=node.rack, node_ids=ids, reason=decision.reason))
    return True
