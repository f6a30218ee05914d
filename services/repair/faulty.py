"""A person reports nodes as faulty, as the managed training clusters' ``reportFaultyNodes``
defines it: delete a node (recreated with the same name and spec: every mtc pool is fixed
size, so every node is static), or report its host as faulty (the node goes REPAIRING and
comes back on a repaired or new host, under the same name).

Each report is a diagnosis handed to the repair service (``handlers.on_diagnosed``), so it
takes the automated path: the jobs on the node checkpoint and recover by their chosen mode,
the blast-radius guard may hold it (SUSPECT, released with ``releaseHold``), and the ladder
and lemon detection still apply. The node remembers the request (``operator_request``), so a
repeat of the same report changes nothing, and a held host report stays a host report when
it is released. On Compute Engine a host report is ``reportHostAsFaulty`` with the reasons
given; elsewhere the repair records it as the stand-in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.repair import handlers as repair
from services.repair.operator import node_of
from shared.domain.errors import Conflict
from shared.domain.events import NodeDiagnosed, NodeOperatorActed
from shared.domain.health import RepairAction, Severity
from shared.domain.model import Node, NodeRole
from shared.handling import Deps
from shared.ports import UnitOfWork

DELETE, REPORT_HOST = "deleteNode", repair.HOST_REPORT
BEHAVIORS = ("BEHAVIOR_UNSPECIFIED", "PERFORMANCE", "SILENT_DATA_CORRUPTION",
             "UNRECOVERABLE_GPU_ERROR")
ACTIONS = {DELETE: RepairAction.REIMAGE, REPORT_HOST: RepairAction.REPLACE}


@dataclass(frozen=True)
class FaultReason:
    behavior: str
    description: str = ""

    def text(self) -> str:
        # the behavior leads, so the Compute Engine adapter reports it as given
        return f"{self.behavior}: {self.description}".rstrip(": ")


@dataclass(frozen=True)
class NodeAction:
    node_id: str
    host_reasons: tuple[FaultReason, ...] | None = None  # None: delete the node

    @property
    def verb(self) -> str:
        return DELETE if self.host_reasons is None else REPORT_HOST

    def reason(self) -> str:
        if not self.host_reasons:
            return "deleted as faulty by an operator"
        return "host reported faulty: " + "; ".join(r.text() for r in self.host_reasons)


def report(actions: Sequence[NodeAction], cluster_id: str, by: str, uow: UnitOfWork,
           deps: Deps) -> list[Node]:
    """Every node is checked before any is acted on: one bad node id changes nothing."""
    nodes = [node_of(cluster_id, a.node_id, uow) for a in actions]
    for node in nodes:
        if node.role is not NodeRole.WORKER:
            raise Conflict(f"node {node.node_id} is the login node: it runs no jobs")
    return [_one(a, node, cluster_id, by, uow, deps) for a, node in zip(actions, nodes,
                                                                         strict=True)]


def _one(action: NodeAction, node: Node, cluster_id: str, by: str, uow: UnitOfWork,
         deps: Deps) -> Node:
    reason = action.reason()
    request = f"{action.verb}:{reason}"
    if node.operator_request == request:
        return node  # the same report again (a retry): already in hand
    now = deps.clock.now()
    node.operator_request = request
    repair.on_diagnosed(NodeDiagnosed(
        node_id=node.node_id, observed_at=now, failure_mode=reason,
        severity=Severity.CRITICAL.value, action=ACTIONS[action.verb].value,
        reasons=(reason,)), uow, deps)
    uow.emit(NodeOperatorActed(node_id=node.node_id, cluster_id=cluster_id, action=action.verb,
                               reason=reason, by=by, at=now))
    return node
