"""Gang scheduling onto idle nodes, and the periodic tick's deadlines and watchdog.

Scheduling runs whenever capacity or demand may have changed (``handlers``). The periodic
tick also enforces ``scheduling.timeout`` (``shared.domain.timeouts``), runs the progress
watchdog (``shared.domain.progress``) and starts the jobs whose restart backoff
(``Job.recovery.not_before``, ``shared.policies.restarts``) has passed: scheduling skips a
job until then, and a job a full disk interrupted until its file system has room again
(``waits_for_storage``). Every decision is made from stored state, so a repeated call places nothing
twice.
"""

from __future__ import annotations

from services.job_submission import queues
from shared.domain import lifecycle, progress, ranks, storage, timeouts
from shared.domain.adopted import adopted
from shared.domain.events import JobFinished, JobInterruptRequested, NodeDrained
from shared.domain.model import Job, JobState
from shared.handling import Deps
from shared.policies.scheduling import place_jobs
from shared.ports import StorageSpace, UnitOfWork
from shared.service_layer import job_nodes, preflight
from shared.service_layer.capacity import idle_slots, request
from shared.service_layer.gangs import gang, local_output_dir, output_dirs, start_attempt

__all__ = ["enforce_timeouts", "free_held_nodes", "gang", "idle_slots", "local_output_dir",
           "output_dirs", "schedule", "watch_progress"]

PREFLIGHT_ROUNDS = 3  # placements per pass: the first, and again after a failed preflight


def free_held_nodes(job: Job, uow: UnitOfWork, deps: Deps, reason: str = "job cancelled"
                     ) -> None:
    """A pending resumed job holds its healthy nodes; giving up the job gives them back."""
    for node_id in filter(None, job.node_ids):
        node = uow.nodes.get(node_id)
        if node is not None and lifecycle.release_from_job(node, job.job_id, deps.clock.now(),
                                                           reason):
            uow.emit(NodeDrained(node_id=node.node_id, reason=node.reason))
    job.node_ids = ranks.Ranks()


def watch_progress(cluster_id: str, uow: UnitOfWork, deps: Deps) -> None:
    """The progress watchdog (``shared.domain.progress``): a running job silent for longer
    than its limit is asked to stop (SIGTERM, grace) and is requeued when its workers exit.
    Idempotent like the deadline: a job already told to stop is left alone, and
    checkpoint_resume signals an attempt once whatever the number of requests."""
    timeout, factor = deps.config.progress_timeout_s, deps.config.progress_interval_factor
    if timeout <= 0:
        return
    now = deps.clock.now()
    for job in uow.jobs.list(cluster_id, state=JobState.RUNNING):
        if progress.stalled(job, now, timeout, factor) and not adopted(job.spec):
            uow.emit(JobInterruptRequested(job_id=job.job_id, attempt=job.attempt, node_id="",
                                           reason=progress.no_progress_reason(job, now, timeout,
                                                                              factor)))


def enforce_timeouts(cluster_id: str, uow: UnitOfWork, deps: Deps) -> None:
    """``scheduling.timeout`` (see ``shared.domain.timeouts`` for how it is measured): a
    running job past its deadline is asked to stop, once (checkpoint_resume sends the SIGTERM
    and fails the job when its workers exit); one between attempts is failed here, its held
    nodes given back. Idempotent by state: a job already told to stop, or already failed,
    is left alone, so a repeated tick signals nothing twice."""
    now = deps.clock.now()
    for job in uow.jobs.list(cluster_id, state=JobState.RUNNING):
        if timeouts.needs_stop(job, now):
            uow.emit(JobInterruptRequested(job_id=job.job_id, attempt=job.attempt, node_id="",
                                           reason=timeouts.timeout_error(job)))
    # between attempts a job is PENDING (a QUEUED job has never started: no clock yet)
    for job in uow.jobs.list(cluster_id, state=JobState.PENDING):
        if timeouts.fail_between_attempts(job, now):
            job.error = timeouts.timeout_error(job)
            free_held_nodes(job, uow, deps, "job timed out")
            job.transition(JobState.FAILED, now)
            uow.emit(JobFinished(job_id=job.job_id, cluster_id=job.cluster_id,
                                 state=job.state.value, restart_count=job.restart_count,
                                 detail=job.error))


def schedule(cluster_id: str, uow: UnitOfWork, deps: Deps) -> None:
    """Gang-place pending jobs on idle worker nodes and start their workers. A resumed job
    still holds its healthy nodes: only the holes its lost nodes left are placed. Slurm, not
    mtc, places the jobs mtc adopted (``adoption``). Where the cluster asks for it, a preflight
    among the placed gang's nodes comes first (``shared.service_layer.preflight``): a node that
    fails it is left out and the job is placed again, at most ``PREFLIGHT_ROUNDS`` times a pass
    (then it waits for the next)."""
    # (the query reads stored states: a job this transaction ended, e.g. timed out, is out)
    now = deps.clock.now()  # a job backing off after a restart waits for its time
    pending = [j for j in uow.jobs.list(cluster_id, state=JobState.PENDING)
               if j.state is JobState.PENDING
               and (j.recovery.not_before is None or j.recovery.not_before <= now)
               and not adopted(j.spec) and not waits_for_storage(j, deps)]
    if not pending:
        return
    for job in pending:
        _drop_unfit(job, uow, deps)
    ready = [j for j in pending if j.node_ids and not ranks.holes(j.node_ids)]
    for job in ready:  # nothing was lost (e.g. a preempted program): start again at once
        _start(job, [], uow, deps)
    waiting = [j for j in pending if not j.node_ids or ranks.holes(j.node_ids)]
    # team queues (a cluster with quotas): only what the policy admits, borrowers preempted
    # for a reclaim even when nothing is idle
    waiting = queues.admit(cluster_id, waiting, uow, deps) if waiting else waiting
    if not waiting:
        return
    partitions = {j.spec.scheduling.partition for j in waiting}
    slots = idle_slots(cluster_id, uow, None if None in partitions else partitions)
    if not slots:
        return
    for job in waiting:
        _clear_cleared_suspects(job, uow)
    by_id = {j.job_id: j for j in waiting}
    for _ in range(PREFLIGHT_ROUNDS):  # a job whose preflight failed is placed again
        requests = [request(job) for job in waiting]
        placements = place_jobs(requests, slots, now, backfill=deps.config.backfill)
        used: set[str] = set()
        waiting = []
        for placement in placements:
            job, placed = by_id[placement.job_id], list(placement.node_ids)
            failed = preflight.check(job, placed, uow, deps)
            used.update(failed)
            if failed:
                waiting.append(job)
                continue
            used.update(placed)
            _start(job, placed, uow, deps)
        slots = [s for s in slots if s.node_id not in used]
        if not waiting or not slots:
            return


def waits_for_storage(job: Job, deps: Deps) -> bool:
    """A job a full disk interrupted (``Job.recovery.storage_full``) waits until the file
    system of its files has more than the floor free again (``shared.domain.storage``),
    read afresh on every pass (each tick's included; no loop of its own): True while it
    still waits. Where the compute cannot read it the job goes: its next attempt tells."""
    rec = job.recovery
    if not rec.storage_full:
        return False
    compute = deps.compute
    space = compute.storage_space(rec.storage_full) if isinstance(compute, StorageSpace) else None
    if space is not None and storage.full(*space, deps.config.storage_floor):
        return True
    rec.storage_full, rec.storage_full_since = "", None  # room again: it resumes
    return False


def _drop_unfit(job: Job, uow: UnitOfWork, deps: Deps) -> None:
    """A pending job resumes only on nodes that take new work: a node it kept that is held
    by the blast-radius guard (SUSPECT), has an active fault that takes it out, or was
    drained by an operator leaves the job (its state otherwise stays as it is: a held node
    stays held in service) and becomes a hole that placement fills, or the job waits."""
    if not any(job.node_ids):
        return
    now = deps.clock.now()
    # a sound node allocated to the job keeps it: read only the others (keys-only query)
    for node_id in job_nodes.unsound(job, uow):
        node = uow.nodes.get(node_id)
        if node is not None and node.job_id == job.job_id and lifecycle.takes_work(node):
            continue
        if node is not None and lifecycle.release_from_job(node, job.job_id, now,
                                                           "takes no new work"):
            uow.emit(NodeDrained(node_id=node.node_id, reason=node.reason))
        job.node_ids = ranks.with_holes(job.node_ids, {node_id})


def _clear_cleared_suspects(job: Job, uow: UnitOfWork) -> None:
    """A suspect is kept out of the job's next placement while it is held or repaired; once
    it takes work again after the job was requeued (returned by its repair and checks, or
    released by a healthy report), the suspicion was answered and it may be placed again.
    Without this a job whose only fitting node was its suspect waited for ever beside the
    repaired node, idle."""
    rec = job.recovery
    if not rec.excluded_node_ids:
        return
    kept = []
    for node_id in rec.excluded_node_ids:
        node = uow.nodes.get(node_id)
        if node is not None and lifecycle.takes_work(node) and node.since >= job.updated_at:
            continue
        kept.append(node_id)
    rec.excluded_node_ids = kept


def _start(job: Job, placed: list[str], uow: UnitOfWork, deps: Deps) -> None:
    job.queue = None  # it no longer waits
    start_attempt(job, placed, uow, deps)  # (shared with the recoveries that skip the queue)
