"""A node's return to service as the services announce it, and an operator's resume.

Health triage returns a verified node (and releases a held one) and announces it with
``returned``; an operator's resume (a command of the repair service's ``operator``, or their
own Slurm drain lifted, which triage sees in a report) puts the node back the same way, so
both services share this step instead of one reaching into the other.
"""

from __future__ import annotations

from shared.domain import lifecycle
from shared.domain.events import NodeReturnedToService
from shared.domain.model import Node
from shared.handling import Deps
from shared.ports import UnitOfWork


def returned(node: Node) -> NodeReturnedToService:
    """The announcement that ``node`` takes work again (its partition named, so provisioning's
    readiness check reads no node)."""
    return NodeReturnedToService(node_id=node.node_id, cluster_id=node.cluster_id,
                                 partition=node.partition)


def resume(node: Node, uow: UnitOfWork, deps: Deps, text: str) -> None:
    """An operator lifted their drain (``mtc node resume``, or their own Slurm drain lifted):
    back to service now, or through verification when the node had faults."""
    partition = uow.partitions.get(node.cluster_id, node.partition)
    if lifecycle.operator_resume(node, partition, deps.clock.now(), text):
        deps.compute.uncordon(node.node_id)
        uow.emit(returned(node))
