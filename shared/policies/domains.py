"""Racks as a unit of failure: when is a rack drained and repaired as one? Pure.

A rack's power shelf, top-of-rack switch or NVLink switch tray takes several of its nodes
together; repairing them one by one, each counted against the partition's blast-radius
guard, holds most of them in service (SUSPECT) on a shared cause and raises one alert per
node. Instead, once at least ``RepairConfig.domain_drain_fraction`` of a rack's nodes are bad
(out of service, held, or carrying a fault; the node being diagnosed included), the whole
rack is drained and repaired as one, with one alert.

The guard per domain: at most ``RepairConfig.max_domains_out`` racks of a partition are
drained as one at a time (a further rack is held: its nodes go through the per-node guard
and its alert says so); the nodes of a drained rack count against that limit, not against
the partition's per-node limits (``PartitionView`` leaves them out), so one rack event does
not hold every unrelated repair in the partition.

``domain_drain_fraction`` 0 (the default) turns all of this off: repairs are per node, as
without topology. Nodes without a rack are never part of a domain decision.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shared.domain.health import RepairAction
from shared.policies.repair import RepairConfig

# what the rack's other nodes get: a power cycle once the shared part is fixed (the diagnosed
# node takes the greater of its own action and this)
DOMAIN_ACTION = RepairAction.REBOOT


@dataclass(frozen=True)
class DomainView:
    """What the decision needs to know about the diagnosed node's rack right now."""

    domain: str  # the rack ("" = none)
    node_ids: frozenset[str]  # its nodes that have not left for good (not RETIRED)
    bad_node_ids: frozenset[str]  # out of service, held (SUSPECT) or with an active fault
    drained: bool  # the rack is drained as one already
    drained_in_partition: int  # racks of the partition drained as one now


class DomainDecisionKind(enum.StrEnum):
    NONE = "none"  # decide per node, as without topology
    DRAIN = "drain"  # drain and repair every node of the rack, raise one alert
    HOLD = "hold"  # the rack should go, but the guard per domain holds it: one alert


@dataclass(frozen=True)
class DomainDecision:
    kind: DomainDecisionKind
    reason: str = ""


def plan_domain(view: DomainView, node_id: str, config: RepairConfig) -> DomainDecision:
    """Drain ``view``'s rack as one, hold it, or leave the decision to the per-node policy."""
    if config.domain_drain_fraction <= 0 or not view.domain or not view.node_ids:
        return DomainDecision(DomainDecisionKind.NONE)
    if view.drained:
        return DomainDecision(DomainDecisionKind.NONE, f"rack {view.domain} already drained")
    bad = len((view.bad_node_ids | {node_id}) & view.node_ids)
    total = len(view.node_ids)
    if bad < config.domain_drain_fraction * total - 1e-9:
        return DomainDecision(DomainDecisionKind.NONE)
    what = (f"rack {view.domain}: {bad} of {total} nodes bad (drain at "
            f"{config.domain_drain_fraction:g})")
    if view.drained_in_partition + 1 > config.max_domains_out:
        return DomainDecision(DomainDecisionKind.HOLD, f"{what}; HOLD: "
                              f"{view.drained_in_partition} rack(s) of the partition drained "
                              f"already (limit {config.max_domains_out})")
    return DomainDecision(DomainDecisionKind.DRAIN, f"{what}: drained and repaired as one")
