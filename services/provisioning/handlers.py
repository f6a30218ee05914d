"""Provisioning: turn a cluster's desired spec into node records and machines.

The steps are idempotent functions of (cluster, generation). The event handlers call them
one after another; the Cloud Workflow calls the same steps over HTTP and polls between them.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from shared.domain import lifecycle, topology
from shared.domain.errors import NotFound, TransientError
from shared.domain.events import (
    ClusterCreateRequested,
    ClusterDeleted,
    ClusterDeleteRequested,
    ClusterReady,
    ClusterUpdateRequested,
    JobFinished,
    NodeDrained,
    NodeDraining,
    NodeProvisioned,
    NodeRetired,
    NodeReturnedToService,
)
from shared.domain.model import (
    IN_SERVICE,
    Cluster,
    ClusterState,
    JobState,
    Node,
    NodeRole,
    NodeState,
    Partition,
)
from shared.handling import Deps
from shared.ports import UnitOfWork, provision_nodes
from shared.service_layer import deep_checks, triage_policy

SERVICE = "provisioning"
log = logging.getLogger("mtc.provisioning")
SETTLING = lifecycle.COMING_UP


def node_name(cluster_id: str, pool_id: str, index: int) -> str:
    """``{cluster}-{pool}-{index:03d}``, each id's own hyphens doubled: one name per node.

    Node ids share one collection, so the name must not be ambiguous: with plain joins,
    cluster ``a`` pool ``b-c`` and cluster ``a-b`` pool ``c`` both made ``a-b-c-000`` and the
    second cluster took the first one's nodes. Ids begin and end with a letter or digit, so
    in the name a single hyphen is always a separator and a run of two a hyphen of an id;
    ids without hyphens (most) keep the names they always had (``c1-gpu-001``). Only
    letters, digits and hyphens: valid as a Slurm NodeName and a GCE instance name."""
    return f"{_escape(cluster_id)}-{_escape(pool_id)}-{index:03d}"


def login_name(cluster_id: str) -> str:
    return f"{_escape(cluster_id)}-login"


def _escape(id_: str) -> str:
    return id_.replace("-", "--")


# ---------------------------------------------------------------- steps


def step_create_nodes(cluster_id: str, generation: int, uow: UnitOfWork, deps: Deps) -> int:
    """Create the node records the spec asks for and request their machines. Returns how many
    nodes were requested by this call (0 when a retry finds everything already there)."""
    cluster = stored_cluster(cluster_id, uow)
    if cluster.generation != generation:
        return 0  # a newer spec superseded this request
    now = deps.clock.now()
    spec = cluster.spec
    existing = {n.node_id: n for n in uow.nodes.list(cluster_id)}
    requested = 0
    login = login_name(cluster_id)
    if login not in existing and _free(login, cluster_id, uow):
        node = Node(login, cluster_id, "login", "", NodeRole.LOGIN, spec.login_machine_type,
                    None, 0, NodeState.PROVISIONING, now, generation=generation,
                    renewed_at=now)
        uow.nodes.add(node)
        deps.compute.provision_node(node)
        requested += 1
    for pool in spec.node_pools:
        partition_name = spec.partition_of(pool.pool_id)
        active = sorted((n for n in existing.values()
                         if n.pool == pool.pool_id and n.state is not NodeState.RETIRED
                         and not n.retire_when_drained), key=lambda n: n.node_id)
        for node in active:  # partitions may have been re-drawn by an update
            node.partition = partition_name
        taken = {n.node_id for n in existing.values()}
        index = 0
        workers = sum(1 for n in active if not n.is_spare)  # counted once, not per node
        asked: list[Node] = []  # the pool's new machines, asked for in one request
        spread = pool.topology is not None and pool.topology.spare_layout == "perRack"
        spare_at = topology.spare_indices(pool.topology, pool.pool_id, pool.node_count,
                                          pool.spare_count) if spread else frozenset()
        while len(active) < pool.node_count:
            name = node_name(cluster_id, pool.pool_id, index)
            index += 1
            if name in taken or not _free(name, cluster_id, uow):
                continue
            place = topology.place_of(pool.topology, pool.pool_id, index - 1)
            spare = (index - 1 in spare_at) if spread \
                else workers >= pool.node_count - pool.spare_count
            node = Node(name, cluster_id, pool.pool_id, partition_name, NodeRole.WORKER,
                        pool.machine_spec.machine_type, pool.machine_spec.accelerator_type,
                        pool.machine_spec.accelerator_count, NodeState.PROVISIONING, now,
                        is_spare=spare, generation=generation, renewed_at=now,
                        rack=place.rack, nvlink_domain=place.nvlink_domain,
                        switch=place.switch)
            uow.nodes.add(node)
            asked.append(node)
            active.append(node)
            workers += not node.is_spare
            requested += 1
        provision_nodes(deps.compute, asked)
        requested += _shrink(pool.node_count, active, uow, deps)
    _sync_partitions(cluster, uow)
    return requested


def _free(name: str, cluster_id: str, uow: UnitOfWork) -> bool:
    """No node document has this id yet. One that does is never adopted (overwritten), least
    of all another cluster's: its nodes stay its own, in their state; the caller takes the
    next free name instead."""
    found = uow.nodes.get(name)
    if found is None:
        return True
    if found.cluster_id != cluster_id:
        log.error("%s: node id %s belongs to cluster %s; not adopted", cluster_id, name,
                  found.cluster_id)
    return False


def _shrink(target: int, active: list[Node], uow: UnitOfWork, deps: Deps) -> int:
    """Scale down: idle nodes leave at once, busy ones drain first (their jobs checkpoint)."""
    surplus = len(active) - target
    if surplus <= 0:
        return 0
    now = deps.clock.now()
    order = sorted(active, key=lambda n: (n.state is NodeState.ALLOCATED, not n.is_spare,
                                          n.node_id), reverse=False)
    for node in order[:surplus]:
        node.retire_when_drained = True
        if node.state is NodeState.ALLOCATED and node.job_id:
            node.transition(NodeState.DRAINING, now, "scale-down")
            uow.emit(NodeDraining(node_id=node.node_id, job_id=node.job_id, reason="scale-down"))
        elif node.state is not NodeState.DRAINING:
            _retire(node, uow, deps, "scale-down")
    return 0


def _retire(node: Node, uow: UnitOfWork, deps: Deps, reason: str) -> None:
    if not lifecycle.retire(node, deps.clock.now(), reason):
        return
    deps.compute.delete_node(node.node_id)
    uow.emit(NodeRetired(node_id=node.node_id, reason=reason))


def _sync_partitions(cluster: Cluster, uow: UnitOfWork) -> None:
    nodes = [n for n in uow.nodes.list(cluster.cluster_id)
             if n.role is NodeRole.WORKER and n.state is not NodeState.RETIRED]
    for part in cluster.spec.partitions:
        record = uow.partitions.get(cluster.cluster_id, part.name)
        if record is None:
            record = Partition(cluster.cluster_id, part.name)
            uow.partitions.add(record)
        members = [n for n in nodes if n.partition == part.name]
        record.total_nodes = len(members)
        # nodes repair took out stay listed; nodes coming up for the first time are counted
        taken_out = record.out_of_service
        record.set_out_of_service({n.node_id for n in members if not n.in_service
                                   and (n.state not in SETTLING or n.node_id in taken_out)})
        record.settling = sum(1 for n in members if n.state in SETTLING
                              and n.node_id not in taken_out)


@dataclass(frozen=True)
class ClusterStatus:
    """What the workflow polls: are all nodes of this generation settled, and how."""

    cluster_id: str
    state: str
    generation: int
    settling: int
    in_service: int
    failed: int

    @property
    def done(self) -> bool:
        return self.settling == 0


def step_status(cluster_id: str, uow: UnitOfWork) -> ClusterStatus:
    """Counted from two fields of every node (a projection), not every node decoded and
    compared again at commit (2,081 of them when a Llama 3 cluster comes up)."""
    cluster = stored_cluster(cluster_id, uow)
    states = Counter((state, generation == cluster.generation) for state, generation
                     in uow.nodes.project(cluster_id, ("state", "generation")))
    return ClusterStatus(
        cluster_id, cluster.state.value, cluster.generation,
        settling=sum(n for (state, _), n in states.items() if state in _SETTLING_VALUES),
        in_service=sum(n for (state, _), n in states.items() if state in _IN_SERVICE_VALUES),
        failed=states[(NodeState.FAILED.value, True)],
    )


_SETTLING_VALUES = frozenset(s.value for s in SETTLING)
_IN_SERVICE_VALUES = frozenset(s.value for s in IN_SERVICE)


def step_mark_ready(cluster_id: str, generation: int, uow: UnitOfWork, deps: Deps) -> bool:
    cluster = stored_cluster(cluster_id, uow)
    if cluster.generation != generation or cluster.state not in (ClusterState.PROVISIONING,
                                                                 ClusterState.UPDATING):
        return cluster.state is ClusterState.READY
    status = step_status(cluster_id, uow)
    if not status.done or status.failed:
        return False  # a node of this generation failed: the workflow (or event path) rolls back
    cluster.transition(ClusterState.READY, deps.clock.now(), "all nodes in service")
    uow.emit(ClusterReady(cluster_id=cluster_id, generation=generation))
    return True


def step_rollback(cluster_id: str, generation: int, reason: str, uow: UnitOfWork,
                  deps: Deps) -> None:
    """Undo what this generation created and mark the cluster failed."""
    cluster = stored_cluster(cluster_id, uow)
    if cluster.generation != generation or cluster.state not in (ClusterState.PROVISIONING,
                                                                 ClusterState.UPDATING):
        return  # superseded, already failed, or already ready: nothing of ours to undo
    for node in uow.nodes.list(cluster_id):
        if node.generation == generation:  # login node included: everything this step made
            _retire(node, uow, deps, f"rollback: {reason}")
    _sync_partitions(cluster, uow)
    cluster.transition(ClusterState.FAILED, deps.clock.now(), reason)


# ---------------------------------------------------------------- event handlers


def start_workflow(cluster_id: str, generation: int, deps: Deps) -> None:
    """The workflow runs the steps: start its execution for this generation (at least once;
    a duplicate execution's ``validate`` step finds nothing left to do)."""
    if deps.workflows is None:
        log.warning("provisioning=workflow and no workflow runner: the execution for %s"
                    " generation %d must be started by its caller", cluster_id, generation)
        return
    name = deps.workflows.start({"cluster_id": cluster_id, "generation": generation})
    log.info("started %s for %s generation %d", name, cluster_id, generation)


def on_create_requested(event: ClusterCreateRequested, uow: UnitOfWork, deps: Deps) -> None:
    if deps.config.provisioning == "workflow":
        start_workflow(event.cluster_id, event.generation, deps)
        return
    step_create_nodes(event.cluster_id, event.generation, uow, deps)
    step_mark_ready(event.cluster_id, event.generation, uow, deps)


def on_update_requested(event: ClusterUpdateRequested, uow: UnitOfWork, deps: Deps) -> None:
    if deps.config.provisioning == "workflow":
        start_workflow(event.cluster_id, event.generation, deps)
        return
    step_create_nodes(event.cluster_id, event.generation, uow, deps)
    step_mark_ready(event.cluster_id, event.generation, uow, deps)


def on_node_provisioned(event: NodeProvisioned, uow: UnitOfWork, deps: Deps) -> None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        # compute can answer before the transaction that asked for the node is visible:
        # retry; an id that never appears is dead-lettered after the delivery attempts
        raise TransientError(f"node {event.node_id} is not recorded (yet)")
    if node.state is not NodeState.PROVISIONING:
        return
    now = deps.clock.now()
    if not event.ok:
        node.transition(NodeState.FAILED, now, f"provisioning failed: {event.detail}")
        if deps.config.provisioning == "workflow":
            return  # its health check sees the failed node and rolls back
        cluster = stored_cluster(node.cluster_id, uow)
        step_rollback(cluster.cluster_id, cluster.generation, f"{node.node_id}: {event.detail}",
                      uow, deps)
        return
    if node.role is NodeRole.LOGIN:
        node.transition(NodeState.IDLE, now, "login node up")
        _maybe_ready(node.cluster_id, uow, deps)
        return
    node.transition(NodeState.VERIFYING, now, "up; running its first checks")
    # first join (or a replacement's): deep checks gate its entry when policy asks for them
    deep_checks.request(node, "replace" if node.replaces else "first_join", deps)


def on_node_returned(event: NodeReturnedToService, uow: UnitOfWork, deps: Deps) -> None:
    _maybe_ready(event.cluster_id, uow, deps, near=event.node_id, partition=event.partition)


def _maybe_ready(cluster_id: str, uow: UnitOfWork, deps: Deps, near: str | None = None,
                 partition: str = "") -> None:
    cluster = uow.clusters.get(cluster_id)
    if cluster is None or cluster.state not in (ClusterState.PROVISIONING,
                                                ClusterState.UPDATING):
        return  # step_mark_ready would only report the state
    if _still_settling(cluster_id, uow, near, partition):
        return  # cheap proof that step_status would say "not done"
    step_mark_ready(cluster_id, cluster.generation, uow, deps)


def _still_settling(cluster_id: str, uow: UnitOfWork, near: str | None = None,
                    partition: str = "") -> bool:
    """True when a node the partition aggregates list as out of service is still settling.

    Reads a handful of nodes instead of every node of the cluster: while a cluster comes up
    almost every out-of-service node is settling, so the first one read answers. The
    partition of ``near`` (the node that just returned) is looked at first, so a cluster of
    many partitions loads one of them per event. False proves nothing (a settling node outside
    any partition, e.g. the login node): the caller then runs the full check."""
    if near is not None:
        if not partition:  # (the event names it: no read of the node)
            node = uow.nodes.get(near)
            partition = node.partition if node is not None else ""
        if partition:
            own = uow.partitions.get(cluster_id, partition)
            if own is not None and _settling_in(own, uow):
                return True
    return any(_settling_in(p, uow) for p in uow.partitions.list(cluster_id))


def _settling_in(partition: Partition, uow: UnitOfWork) -> bool:
    if partition.settling:
        return True  # nodes are still coming up for the first time
    for node_id in partition.out_of_service:
        node = uow.nodes.get(node_id)
        if node is not None and node.state in SETTLING:
            return True
    return False


def on_node_drained(event: NodeDrained, uow: UnitOfWork, deps: Deps) -> None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        raise NotFound("node", event.node_id)
    if node.retire_when_drained and node.state is NodeState.DRAINED:
        _retire(node, uow, deps, "scale-down")
        cluster = stored_cluster(node.cluster_id, uow)
        _sync_partitions(cluster, uow)
        step_mark_ready(cluster.cluster_id, cluster.generation, uow, deps)


def on_delete_requested(event: ClusterDeleteRequested, uow: UnitOfWork, deps: Deps) -> None:
    _delete(event.cluster_id, uow, deps)


def on_job_finished(event: JobFinished, uow: UnitOfWork, deps: Deps) -> None:
    """A job of a cluster being deleted has exited: the machines may go now. (A job's end is
    a change worth the timeline even when no cluster is being deleted: never UNCHANGED.)"""
    cluster = uow.clusters.get(event.cluster_id)
    if cluster is not None and cluster.state is ClusterState.DELETING:
        _delete(event.cluster_id, uow, deps)


def _delete(cluster_id: str, uow: UnitOfWork, deps: Deps) -> None:
    """Running jobs checkpoint first (SIGTERM, the grace period; compute kills after it);
    the nodes are retired once no worker is left, never under a running program."""
    cluster = stored_cluster(cluster_id, uow)
    if cluster.state is not ClusterState.DELETING:
        return
    now = deps.clock.now()
    waiting = False
    for job in uow.jobs.list(cluster_id):
        if job.terminal:
            continue
        if job.state is JobState.RUNNING:
            job.transition(JobState.CANCELLING, now)
            job.error = job.error or "cluster deleted"
            deps.compute.signal_workers(job.job_id, job.attempt, deps.config.grace_period_s)
        if job.state is JobState.CANCELLING:
            waiting = True
            continue
        job.transition(JobState.CANCELLED, now)
        job.error = job.error or "cluster deleted"
    if waiting:
        return
    for node in uow.nodes.list(cluster_id):
        _retire(node, uow, deps, "cluster deleted")
    # a cluster created again under this id starts without the old one's candidate policy
    triage_policy.clear(uow, cluster_id)
    cluster.transition(ClusterState.DELETED, now, "deleted")
    uow.emit(ClusterDeleted(cluster_id=cluster_id))


def stored_cluster(cluster_id: str, uow: UnitOfWork) -> Cluster:
    """The cluster as stored, whatever its state (a deleted one too: its steps still answer)."""
    cluster = uow.clusters.get(cluster_id)
    if cluster is None:
        raise NotFound("cluster", cluster_id)
    return cluster


SUBSCRIPTIONS = {
    ClusterCreateRequested: on_create_requested,
    ClusterUpdateRequested: on_update_requested,
    ClusterDeleteRequested: on_delete_requested,
    JobFinished: on_job_finished,
    NodeProvisioned: on_node_provisioned,
    NodeReturnedToService: on_node_returned,
    NodeDrained: on_node_drained,
}
