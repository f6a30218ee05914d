"""Which of a job's nodes need a look at a restart, from the store's indexes.

A restart of a 2,048-node job asks twice (checkpoint_resume for its evidence, scheduling for
the nodes the job may keep) which of its nodes have something against them. The answer is
almost always a handful, so it comes from an index bucket and one pass over the ranks
(``filterfalse``: the membership test in C), never from a read of every node.
"""

from __future__ import annotations

import itertools

from shared.domain import lifecycle
from shared.domain.adopted import adopted
from shared.domain.model import Job
from shared.ports import UnitOfWork


def out_of_service(job: Job, uow: UnitOfWork) -> set[str]:
    """The nodes out of service where ``job`` can have nodes, from the partition aggregates
    (no node read): the partition it names (placement gives it no other), else every
    partition of its cluster. Slurm places the jobs mtc adopted: all partitions for those."""
    name = job.spec.scheduling.partition
    if name and not adopted(job.spec):
        partition = uow.partitions.get(job.cluster_id, name)
        return lifecycle.out_of_service([partition] if partition is not None else [])
    return lifecycle.out_of_service(uow.partitions.list(job.cluster_id))


def unsound(job: Job, uow: UnitOfWork) -> list[str]:
    """The nodes holding a rank of ``job`` that are not sound and allocated to it, in rank
    order (the node document's derived ``sound_for`` field, one index bucket): the only ones
    a restart reads."""
    fine = uow.nodes.ids(job.cluster_id, sound_for=job.job_id)
    return [n for n in itertools.filterfalse(fine.__contains__, job.node_ids) if n]
