"""Gang placement of pending jobs onto idle nodes. Pure and deterministic.

- Gang: a job gets one node for every replica of every group, or nothing.
- Order: priority (higher first), then submitted_at (older first), then job_id.
- A node fits a group when machine type, accelerator type and accelerator count are equal, and
  its partition equals the job's partition when the job names one.
- Spares are kept for recovery: fresh jobs never take them. A resumed job takes back its
  previous nodes first (same rank where possible, so the rest of its allocation is kept), then
  spares, then other idle nodes. Within each preference, ties go to the lower node_id.
- Topology (nodes with an NVLink domain): within each preference the gang is packed into the
  fewest domains: the smallest domain that holds every rank still to place, else the domains
  with the most fitting nodes first; a resumed job's own domains (where its kept ranks run)
  come first, so a hot spare in the job's rack wins over one elsewhere. Without domains the
  order is the one above.
- Without backfill a job that cannot be placed blocks every lower-ranked job competing for the
  same partition (a job without a partition competes for all), so big jobs are not starved by
  a stream of small ones. With backfill lower-ranked jobs may take what is left; run times are
  unknown here, so this backfill does not protect the blocked job's start time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["JobRequest", "NodeSlot", "Placement", "ReplicaGroup", "place_jobs"]


class NodeSlot(NamedTuple):
    """An idle node as placement sees it (a NamedTuple: scheduling builds one per idle node
    of a partition at each pass, over a thousand when a fleet comes up)."""

    node_id: str
    partition: str
    machine_type: str
    accelerator_type: str | None
    accelerator_count: int
    is_spare: bool = False
    domain: str = ""  # its NVLink domain ("" = none known): placement packs into few


@dataclass(frozen=True)
class ReplicaGroup:
    """One worker pool: ``replica_count`` nodes of one shape (one node per replica)."""

    machine_type: str
    accelerator_type: str | None
    accelerator_count: int
    replica_count: int

    def __post_init__(self) -> None:
        if self.replica_count < 1:
            raise ValueError(f"replica_count must be at least 1, got {self.replica_count}")
        if self.accelerator_count < 0:
            raise ValueError(
                f"accelerator_count must not be negative, got {self.accelerator_count}"
            )

    def fits(self, node: NodeSlot) -> bool:
        return (
            node.machine_type == self.machine_type
            and node.accelerator_type == self.accelerator_type
            and node.accelerator_count == self.accelerator_count
        )


@dataclass(frozen=True)
class JobRequest:
    job_id: str
    partition: str | None
    groups: tuple[ReplicaGroup, ...]
    priority: int
    submitted_at: float
    is_resume: bool = False
    previous_node_ids: tuple[str, ...] = ()  # the job's last placement, in rank order
    excluded_node_ids: tuple[str, ...] = ()  # suspected of ending its attempts: not these
    near_domains: tuple[str, ...] = ()  # NVLink domains its kept ranks run in: fill these first

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"job {self.job_id}: needs at least one replica group")

    @property
    def size(self) -> int:
        return sum(g.replica_count for g in self.groups)

    def rank_key(self) -> tuple[int, float, str]:
        return (-self.priority, self.submitted_at, self.job_id)


@dataclass(frozen=True)
class Placement:
    job_id: str
    node_ids: tuple[str, ...]  # group 0's replicas first, in rank order


def place_jobs(
    pending: Sequence[JobRequest],
    idle: Sequence[NodeSlot],
    now: float,
    *,
    backfill: bool = False,
) -> tuple[Placement, ...]:
    """Place what fits, in rank order; returns placements in that order.

    ``now`` is accepted for interface stability (aging policies); placement does not use it.
    """
    del now
    _check_unique([j.job_id for j in pending], "job_id")
    _check_unique([n.node_id for n in idle], "node_id")
    free = {n.node_id: n for n in idle}
    blocked: set[str] = set()  # partitions held for a blocked job
    blocked_all = False  # a blocked job without a partition holds every partition
    placements: list[Placement] = []
    for job in sorted(pending, key=JobRequest.rank_key):
        if not backfill and (blocked_all or (job.partition is None and blocked)):
            continue
        if not backfill and job.partition is not None and job.partition in blocked:
            continue
        chosen = _assign(job, free)
        if chosen is None:
            if job.partition is None:
                blocked_all = True
            else:
                blocked.add(job.partition)
            continue
        for node_id in chosen:
            del free[node_id]
        placements.append(Placement(job.job_id, chosen))
    return tuple(placements)


def _check_unique(ids: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            raise ValueError(f"duplicate {what} {item!r}")
        seen.add(item)


def _assign(job: JobRequest, free: dict[str, NodeSlot]) -> tuple[str, ...] | None:
    """All nodes for ``job`` in rank order, or None when any replica cannot be served."""
    excluded = frozenset(job.excluded_node_ids)
    eligible = {
        node_id: node
        for node_id, node in free.items()
        if (job.partition is None or node.partition == job.partition) and node_id not in excluded
    }
    if not job.is_resume:
        eligible = {node_id: node for node_id, node in eligible.items() if not node.is_spare}

    slots = [group for group in job.groups for _ in range(group.replica_count)]
    chosen: list[str | None] = [None] * len(slots)
    taken: set[str] = set()

    # 1. A resumed job keeps each previous node in its old rank when it still fits there.
    if job.is_resume:
        for rank, node_id in enumerate(job.previous_node_ids[: len(slots)]):
            node = eligible.get(node_id)
            if node is not None and node_id not in taken and slots[rank].fits(node):
                chosen[rank] = node_id
                taken.add(node_id)

    # 2. Fill the remaining ranks: other previous nodes, then spares, then the rest.
    # (only the eligible nodes' places: a 2,048-node job's previous list is long, and the
    # nodes free for its holes are few; its nodes are unique, so the first place is the one)
    previous = job.previous_node_ids
    was_here = set(eligible).intersection(previous)  # the few free ones, not a set of all
    previous_order = {node_id: previous.index(node_id) for node_id in was_here}

    domain_rank = _domain_ranks(slots, chosen, eligible, taken, job.near_domains)

    def preference(node: NodeSlot) -> tuple[int, int, int, str]:
        if node.node_id in previous_order:
            return (0, previous_order[node.node_id], 0, node.node_id)
        return (1 if node.is_spare else 2, 0, domain_rank.get(node.domain, 0), node.node_id)

    candidates = sorted(eligible.values(), key=preference)
    # where each group's scan resumes: a candidate passed over was taken or does not fit the
    # group, and stays so (a 2,048-rank first placement is one pass, not 2,048)
    resume_at: dict[ReplicaGroup, int] = {}
    for rank, group in enumerate(slots):
        if chosen[rank] is not None:
            continue
        at = resume_at.get(group, 0)
        while at < len(candidates) and (candidates[at].node_id in taken
                                        or not group.fits(candidates[at])):
            at += 1
        if at == len(candidates):
            return None
        pick = candidates[at]
        resume_at[group] = at + 1
        chosen[rank] = pick.node_id
        taken.add(pick.node_id)
    return tuple(node_id for node_id in chosen if node_id is not None)


def _domain_ranks(slots: Sequence[ReplicaGroup], chosen: Sequence[str | None],
                  eligible: dict[str, NodeSlot], taken: set[str],
                  near: Sequence[str]) -> dict[str, int]:
    """The order to fill NVLink domains in (lower first): the job's own domains (those its
    kept ranks run in, most ranks first), then the smallest domain that holds every rank
    still open, then the domains with the most fitting free nodes. Empty when no node has a
    domain (placement is then what it was without topology). Nodes without a domain last."""
    if not any(node.domain for node in eligible.values()):
        return {}
    groups = set(slots)
    need = sum(1 for node_id in chosen if node_id is None)
    free: dict[str, int] = {}
    for node in eligible.values():
        if node.domain and node.node_id not in taken and any(g.fits(node) for g in groups):
            free[node.domain] = free.get(node.domain, 0) + 1
    own = {domain: 1 for domain in near if domain}
    for node_id in chosen:
        slot = eligible.get(node_id) if node_id is not None else None
        if slot is not None and slot.domain:
            own[slot.domain] = own.get(slot.domain, 0) + 1
    order = sorted(own, key=lambda d: (-own[d], d))
    holding = sorted((d for d in free if d not in own and free[d] >= need),
                     key=lambda d: (free[d], d))
    order += holding[:1]
    order += sorted((d for d in free if d not in order), key=lambda d: (-free[d], d))
    ranks = {domain: rank for rank, domain in enumerate(order)}
    ranks[""] = len(order)
    return ranks
