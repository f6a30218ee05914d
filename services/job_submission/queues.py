"""Team queues at scheduling time (``shared.policies.fair_share``): on a cluster with
``queues`` (``shared.domain.queues``) only the jobs the policy admits go on to placement,
running jobs of teams that borrow are preempted when a team reclaims its nominal quota, and
every waiting job records its queue, position and reason for the API (``Job.queue``).

A preemption is an interrupt like any other (``JobInterruptRequested``: SIGTERM, the grace
period, a checkpoint): checkpoint_resume requeues the job when its workers exit and, because
the reason starts with ``preemption``, gives back all its nodes (it does not restart in place
on them) and the goodput tally counts its lost time under the cause ``preemption``. A cluster
without queues is scheduled exactly as before.

A job that names no partition is governed when the cluster has one partition (it is that
partition's); on a cluster with several it is not governed by the queues (no partition to
charge it to) and is placed as before.
"""

from __future__ import annotations

from shared.domain import queues
from shared.domain.events import JobInterruptRequested
from shared.domain.model import Job, JobState, NodeRole, NodeState
from shared.domain.specs import ClusterSpec
from shared.handling import Deps
from shared.policies import fair_share
from shared.ports import UnitOfWork
from shared.service_layer.capacity import request

__all__ = ["admit"]

_WORKER, _IDLE = NodeRole.WORKER.value, NodeState.IDLE.value


def admit(cluster_id: str, waiting: list[Job], uow: UnitOfWork, deps: Deps) -> list[Job]:
    """The jobs of ``waiting`` that placement may place, in their given order; preempts
    the borrowers a reclaim needs and records each waiting job's queue view."""
    cluster = uow.clusters.get(cluster_id)
    if cluster is None or not cluster.spec.queues:
        return waiting
    spec = cluster.spec
    quotas = [fair_share.Quota(q.team, q.partition, q.nominal_nodes, q.borrowing_limit_nodes)
              for q in spec.queues]
    capacity = _capacity(cluster_id, uow)
    running: list[fair_share.RunningJob] = []
    by_id: dict[str, Job] = {}
    for state in (JobState.RUNNING, JobState.CANCELLING):
        for job in uow.jobs.list(cluster_id, state=state):
            part = partition_of(job, spec)
            if part is None:
                continue
            by_id[job.job_id] = job
            running.append(fair_share.RunningJob(
                job.job_id, queues.team_of(dict(job.spec.labels)), part,
                sum(1 for n in job.node_ids if n), job.priority, job.started_at or job.created_at,
                stopping=state is JobState.CANCELLING or job.interrupt_requested_at is not None))
    queued: list[fair_share.QueuedJob] = []
    waiting_by_id = {job.job_id: job for job in waiting}
    for job in waiting:
        part = partition_of(job, spec)
        if part is None:
            continue
        held = sum(1 for n in job.node_ids if n)
        queued.append(fair_share.QueuedJob(
            job.job_id, queues.team_of(dict(job.spec.labels)), part,
            request(job).size, job.priority, job.created_at, held))
    decision = fair_share.decide(quotas, capacity, running, queued, deps.clock.now())
    for job_id, reason in decision.preempt:
        victim = by_id[job_id]
        uow.emit(JobInterruptRequested(job_id=job_id, attempt=victim.attempt, node_id="",
                                       reason=reason))
    for q in queued:
        wait = decision.waits[q.job_id]
        view = {"team": q.team, "partition": q.partition, "position": wait.position,
                "reason": wait.reason or "admitted: waiting for fitting idle nodes"}
        job = waiting_by_id[q.job_id]
        if job.queue != view:
            job.queue = view
    admitted = set(decision.admitted)
    governed = {q.job_id for q in queued}
    return [j for j in waiting if j.job_id in admitted or j.job_id not in governed]


def partition_of(job: Job, spec: ClusterSpec) -> str | None:
    named = job.spec.scheduling.partition
    if named is not None:
        return named
    return spec.partitions[0].name if len(spec.partitions) == 1 else None


def _capacity(cluster_id: str, uow: UnitOfWork) -> dict[str, int]:
    """Worker nodes per partition that jobs have or may take now: those allocated to a job
    (a spare that took over a rank included) and the idle non-spares. A node out for repair
    is no capacity: counting it, a team within its quota would wait for it instead of
    reclaiming what a borrower holds."""
    out: dict[str, int] = {}
    rows = uow.nodes.project(cluster_id, ("partition", "role", "is_spare", "state", "job_id"))
    for partition, role, spare, state, job_id in rows:
        if role == _WORKER and (job_id or (state == _IDLE and not spare)):
            out[partition] = out.get(partition, 0) + 1
    return out
