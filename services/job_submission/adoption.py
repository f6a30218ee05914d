"""Adopting the jobs users submit themselves (``sbatch`` in a partition mtc manages).

The Slurm adapter reports each run of such a job as ``JobAdopted`` (attempt = Slurm's restart
count + 1). The first adopts it: a job of origin "slurm" (``shared.domain.adopted``) on the
nodes it runs on, which are allocated to it, so a fault on one of them drains it and
checkpoint-resume signals it like any job. A later one is the run Slurm started after the
requeue: the job's next attempt, on the nodes Slurm chose. ``JobStarted`` follows each, so the
job view and goodput count its restarts and lost work as for any job.

Idempotent and ordered by attempt: a duplicate or older attempt changes nothing; a newer one
while the previous attempt's exit has not been handled yet is retried (transient).
"""

from __future__ import annotations

from shared.domain import lifecycle, progress
from shared.domain.adopted import adopted_spec
from shared.domain.errors import NotFound, TransientError
from shared.domain.events import JobAdopted, JobStarted, NodeDrained
from shared.domain.model import Job, JobState, Node, NodeState
from shared.domain.ranks import Ranks
from shared.handling import Deps
from shared.ports import UnitOfWork


def on_job_adopted(event: JobAdopted, uow: UnitOfWork, deps: Deps) -> None:
    nodes: list[Node] = []
    for node_id in event.node_ids:
        node = uow.nodes.get(node_id)
        if node is None:
            raise NotFound("node", node_id)
        nodes.append(node)
    if not nodes:
        return
    now = deps.clock.now()
    job = uow.jobs.get(event.job_id)
    if job is None:
        spec = adopted_spec(name=event.name, slurm_job_id=event.slurm_job_id, user=event.user,
                            command=event.command, machine_type=nodes[0].machine_type,
                            replicas=len(nodes))
        job = Job(event.job_id, nodes[0].cluster_id, spec, JobState.PENDING, now, now)
        job.attempt = job.restart_count = event.attempt - 1  # adopted after earlier runs
        uow.jobs.add(job)
    if job.terminal or event.attempt <= job.attempt:
        return  # a duplicate, or a run older than the one recorded
    if job.state is not JobState.PENDING:
        raise TransientError(f"job {job.job_id}: attempt {job.attempt} has not ended yet")
    _release_unused(job, set(event.node_ids), uow, now)
    job.node_ids = Ranks(n.node_id for n in nodes)
    for node in nodes:
        if node.state is NodeState.IDLE:
            lifecycle.assign_to_job(node, job.job_id, now)
    job.transition(JobState.RUNNING, now)
    job.attempt = event.attempt
    job.started_at = job.started_at or now
    job.recovery.not_before = None
    progress.started(job, now)
    latest = job.latest_checkpoint
    uow.emit(JobStarted(job_id=job.job_id, attempt=job.attempt, node_ids=tuple(job.node_ids),
                        resume_step=latest.step if latest else -1))
    early = job.recovery.take_early_exit(job.job_id, job.attempt)
    if early is not None:  # its exit was seen before this adoption committed
        uow.emit(early)


def _release_unused(job: Job, keep: set[str], uow: UnitOfWork, now: float) -> None:
    """Nodes the pending job still held (checkpoint-resume keeps the healthy ones) that Slurm
    did not run it on again go back to the pool."""
    for node_id in [n for n in job.node_ids if n and n not in keep]:
        node = uow.nodes.get(node_id)
        if node is not None and lifecycle.release_from_job(node, job.job_id, now, "not rerun here"):
            uow.emit(NodeDrained(node_id=node.node_id, reason=node.reason))
