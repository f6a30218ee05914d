"""What placement sees: the idle worker nodes that take work, and a job's request for its
holes. Scheduling places pending jobs with them; a recovery asks them for spares and the
capacity it would have (``services.checkpoint_resume.modes`` when an attempt ends, the repair
service's straggler weighing before it takes a node out of a running job)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shared.domain import lifecycle, ranks
from shared.domain.model import Job, NodeRole, NodeState
from shared.handling import Deps
from shared.policies import recovery
from shared.policies.recovery import Capacity
from shared.policies.scheduling import JobRequest, NodeSlot, ReplicaGroup, place_jobs
from shared.ports import UnitOfWork
from shared.service_layer.gangs import elastic_pool, pool_counts, pool_range

# up to this many partitions, a query each; more, one query of every idle node (placement
# sorts the slots itself, so their order does not matter): 128 jobs waiting across 16
# partitions made every scheduling pass 16 queries
PER_PARTITION_QUERIES = 2
_WORKER = NodeRole.WORKER.value  # (a constant: asked per idle node)
SLOT_FIELDS = ("node_id", "partition", "machine_type", "accelerator_type", "accelerator_count",
               "is_spare", "role", "sound", "nvlink_domain")


def idle_slots(cluster_id: str, uow: UnitOfWork, partitions: set[str | None] | None = None
               ) -> list[NodeSlot]:
    """The idle worker nodes that take work, as placement sees them (only those of
    ``partitions`` when given: jobs that name a partition are placed nowhere else). A
    projection of the stored fields, not every idle node decoded (and compared again at
    commit): a 16,000-node fleet waiting for its jobs has 16,000 idle nodes, and only the
    nodes placed are read. A sound node takes work; only the others are read to ask
    ``lifecycle.takes_work``."""
    if partitions is not None and len(partitions) <= PER_PARTITION_QUERIES:
        rows = [row for p in sorted(partitions, key=str)
                for row in uow.nodes.project(cluster_id, SLOT_FIELDS, state=NodeState.IDLE,
                                             partition=p)]
    else:  # jobs waiting in many partitions: one query, not one per partition
        rows = uow.nodes.project(cluster_id, SLOT_FIELDS, state=NodeState.IDLE)
        if partitions is not None:
            rows = [row for row in rows if row[1] in partitions]
    slots = []
    for node_id, partition, machine, accel, count, spare, role, sound, domain in rows:
        if role != _WORKER:
            continue
        if not sound:
            node = uow.nodes.get(node_id)
            if node is None or not lifecycle.takes_work(node):
                continue
        slots.append(NodeSlot(node_id, partition, machine, accel, count, spare, domain or ""))
    return slots


def request(job: Job, held: Sequence[str] | None = None) -> JobRequest:
    """Ask only for the holes, pool by pool (ranks are numbered pool after pool; a
    scaled-down job's elastic pool counts its running replicas). ``held``: the ranks to
    ask for instead of the job's own (a hot swap asks before it lets its nodes go)."""
    counts = pool_counts(job)
    if held is None:
        held = job.node_ids if job.node_ids else ("",) * sum(counts)
    groups = []
    first = 0
    for pool, count in zip(job.spec.worker_pool_specs, counts, strict=True):
        missing = ranks.holes_in(held, first, count)  # (remembered per tuple)
        first += count
        if missing:
            groups.append(ReplicaGroup(pool.machine_spec.machine_type,
                                       pool.machine_spec.accelerator_type,
                                       pool.machine_spec.accelerator_count, missing))
    return JobRequest(job.job_id, job.spec.scheduling.partition, tuple(groups), job.priority,
                      job.created_at, job.restart_count > 0, tuple(job.previous_node_ids),
                      tuple(job.recovery.excluded_node_ids))


def could_move(job: Job) -> bool:
    """Whether a recovery could take the job's ranks elsewhere: a peer copy to restore from
    on a spare, or an elastic job that may go on without them."""
    return job.recovery.tiers.get("peer") is not None \
        or recovery.min_replicas(dict(job.spec.labels)) is not None


def spares(job: Job, held: ranks.Ranks, uow: UnitOfWork, deps: Deps) -> list[str]:
    """Idle nodes that fill every hole of ``held`` now (spares first), or none."""
    want = replace(request(job, held), is_resume=True)  # (spares first)
    partition = job.spec.scheduling.partition
    slots = idle_slots(job.cluster_id, uow, None if partition is None else {partition})
    if not slots:
        return []
    if any(slot.domain for slot in slots):  # racks: a spare in the job's own domains first
        kept = set(held)
        want = replace(want, near_domains=tuple(sorted({
            domain for node_id, domain in uow.nodes.project(
                job.cluster_id, ("node_id", "nvlink_domain"), job_id=job.job_id)
            if node_id in kept and domain})))
    found = place_jobs([want], slots, deps.clock.now())
    return list(found[0].node_ids) if found else []


def for_recovery(job: Job, held: ranks.Ranks, placed: list[str], deps: Deps) -> Capacity:
    """What the recovery policy weighs: the elastic pool's size and floor, the spares
    ``placed`` for the holes of ``held``, and when more would come."""
    pool = elastic_pool(job.spec)
    replicas = pool_counts(job)[pool]
    low = recovery.min_replicas(dict(job.spec.labels))
    inside = pool_range(job, pool)
    if any(r not in inside for r in ranks.holes(held)):
        low = None  # a lost rank outside the data-parallel pool: it cannot shrink
    defaults = deps.config.recovery
    return Capacity(replicas, low, len(placed), defaults.spare_eta_s, defaults.repair_eta_s)


def capacity_without(job: Job, node_ids: set[str], uow: UnitOfWork, deps: Deps) -> Capacity:
    """The capacity a recovery would have if ``node_ids`` left ``job`` now (the straggler
    weighing asks before it takes a node out)."""
    held = ranks.with_holes(job.node_ids, node_ids)
    placed = spares(job, held, uow, deps) if could_move(job) and ranks.holes(held) else []
    return for_recovery(job, held, placed, deps)
