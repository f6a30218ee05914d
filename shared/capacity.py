"""What placement sees: the idle worker nodes that take work, and a job's request for its
holes. Scheduling places pending jobs with them; a hot swap asks them for a spare
(``services.checkpoint_resume.modes``)."""

from __future__ import annotations

from collections.abc import Sequence

from shared.domain import lifecycle, ranks
from shared.domain.model import Job, NodeRole, NodeState
from shared.gangs import pool_counts
from shared.policies.scheduling import JobRequest, NodeSlot, ReplicaGroup
from shared.ports import UnitOfWork

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
