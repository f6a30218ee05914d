"""Giving a job's nodes back: idle when healthy, drained (and so repaired) when out."""

from __future__ import annotations

from shared.domain import lifecycle
from shared.domain.events import NodeDrained
from shared.handling import Deps
from shared.ports import UnitOfWork


def release(node_ids: list[str], job_id: str, uow: UnitOfWork, deps: Deps) -> None:
    now = deps.clock.now()
    for node_id in node_ids:
        node = uow.nodes.get(node_id) if node_id else None
        if node is not None and lifecycle.release_from_job(node, job_id, now):
            uow.emit(NodeDrained(node_id=node.node_id, reason=node.reason))
