"""Proposed handler changes, applied at run time for the benchmark only (``--proposed``).

These are NOT in the repository's handlers; the simulator never applies them. They are the
exact changes proposed in docs/simulator.md ("Proposed handler changes"), installed by
monkeypatching so that their effect can be measured from this repository:

1. provisioning ``_maybe_ready``: while the cluster is PROVISIONING or UPDATING, look for one
   node that is still settling among the nodes the partition aggregates list as out of service
   before running ``step_status`` (which loads every node of the cluster). Bring-up of N nodes
   goes from O(N^2) node loads to O(N). Outcomes are unchanged: the pre-check only returns
   early when it has found a settling node, in which case ``step_mark_ready`` would have
   returned False too.
"""

from __future__ import annotations

from typing import Any

_applied = False


def apply() -> None:
    global _applied
    if _applied:
        return
    from services.provisioning import handlers as prov
    from shared.domain.model import ClusterState

    def _settling_in(partition: Any, uow: Any) -> bool:
        for node_id in partition.out_of_service:
            node = uow.nodes.get(node_id)
            if node is not None and node.state in prov.SETTLING:
                return True
        return False

    def _still_settling(cluster_id: str, uow: Any, near: str | None = None) -> bool:
        if near is not None:
            node = uow.nodes.get(near)
            if node is not None and node.partition:
                own = uow.partitions.get(cluster_id, node.partition)
                if own is not None and _settling_in(own, uow):
                    return True
        return any(_settling_in(p, uow) for p in uow.partitions.list(cluster_id))

    def _maybe_ready(cluster_id: str, uow: Any, deps: Any, near: str | None = None) -> None:
        cluster = uow.clusters.get(cluster_id)
        if cluster is None or cluster.state not in (ClusterState.PROVISIONING,
                                                    ClusterState.UPDATING):
            return
        if _still_settling(cluster_id, uow, near):
            return
        prov.step_mark_ready(cluster_id, cluster.generation, uow, deps)

    def on_node_returned(event: Any, uow: Any, deps: Any) -> None:
        _maybe_ready(event.cluster_id, uow, deps, event.node_id)

    prov._maybe_ready = _maybe_ready
    prov.on_node_returned = on_node_returned
    from services.wiring.routes import subscribers, subscriptions
    from shared.domain.events import NodeReturnedToService

    prov.SUBSCRIPTIONS[NodeReturnedToService] = on_node_returned
    subscriptions.cache_clear()
    subscribers.cache_clear()
    _applied = True
