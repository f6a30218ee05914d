"""Checkpoint-resume: tell jobs to checkpoint, record checkpoints, requeue interrupted jobs.

Worker events carry the attempt number: results of an older attempt are stale and ignored,
so a late exit of a killed attempt cannot end the attempt that replaced it. An exit of a newer
attempt than the recorded one outran the commit that started it: it is held on the job and
announced again when that start commits (``JobRecovery.early_exit``).

Which exits restart the job and which fail it is decided on evidence (``shared.domain.exits``,
``restarts.py``): the control plane's own stop, or a node under the attempt that failed,
restarts it (after a backoff when restarts keep coming without progress); any other non-zero
exit, signals included, is the program's and fails it unless the spec says
``restartJobOnWorkerRestart`` (then it restarts, with the same backoff). A non-zero exit while
the file system holding the job's files was full (the adapter's ``storage_full`` evidence,
``shared.domain.storage``) is an interruption too: the job is requeued and waits PENDING
until that file system has room (``job_submission.scheduling``), then resumes from its
checkpoint. So is a rank the platform could not start (the adapter's ``launch_failed``
evidence: the sandbox's set-up failed before exec): no program ran, so the job restarts
with its nodes unblamed and its no-progress streak untouched. Nodes that keep
ending a job's attempts are suspected and handed to repair (``restarts.py``). Restarts whose
attempts end without progress climb a ladder (``escalate.py``): in place, then hot swap,
then requeue, each restoring from a farther tier, then the job fails with the evidence.

A restart does not always go through the queue: ``modes.recover`` asks the recovery policy
(``shared.policies.recovery``) first, and restarts the job in place, on a hot-swapped spare or
scaled down when that loses less time than a requeue (``measure`` keeps the job's figures);
otherwise, and for every job without checkpoint tiers or elasticity, ``_requeue`` as before.

A job past its ``scheduling.timeout`` (``shared.domain.timeouts``) is stopped through the same
interrupt (job_submission's tick asks for it); when that attempt's workers exit, the job fails
with the deadline error instead of being requeued, even if they exit 0 after the SIGTERM.
"""

from __future__ import annotations

import contextlib

from services.checkpoint_resume import escalate, measure, modes, restarts
from services.checkpoint_resume.release import release
from shared.domain import exits, lifecycle, progress, ranks, storage, timeouts
from shared.domain.errors import NotFound
from shared.domain.events import (
    FleetTicked,
    JobCancelRequested,
    JobCheckpointSaved,
    JobFinished,
    JobFirstStep,
    JobInterruptRequested,
    JobRequeued,
    JobRestored,
    JobSignalled,
    JobWorkersExited,
    NodeDrained,
    NodeDraining,
    NodeReturnedToService,
)
from shared.domain.model import Checkpoint, Job, JobState, NodeState
from shared.handling import Deps, Outcome
from shared.policies import checkpointing, fair_share, hangs
from shared.policies.recovery import Tier
from shared.ports import UnitOfWork
from shared.service_layer import gangs, job_nodes

SERVICE = "checkpoint_resume"
PREEMPTED_EXIT = exits.PREEMPTED  # the program checkpointed on SIGTERM and asks to resume
KEEP_CHECKPOINTS = 20
KEEP_HANGS = 5


def on_node_draining(event: NodeDraining, uow: UnitOfWork, deps: Deps) -> None:
    job = uow.jobs.get(event.job_id)
    if job is None or job.state is not JobState.RUNNING or event.node_id not in job.node_ids:
        _release_orphan(event.node_id, uow, deps)
        return
    _interrupt(job, event.reason, uow, deps)


def on_interrupt_requested(event: JobInterruptRequested, uow: UnitOfWork, deps: Deps) -> None:
    job = uow.jobs.get(event.job_id)
    if job is None:
        raise NotFound("job", event.job_id)
    if job.state is not JobState.RUNNING or job.attempt != event.attempt:
        return
    _interrupt(job, hung(job, event), uow, deps)


def on_cancel_requested(event: JobCancelRequested, uow: UnitOfWork, deps: Deps) -> None:
    """A cancel committed: its job's workers get SIGTERM and the grace period. The command
    itself signals nothing, so a cancel whose transaction lost signalled no one."""
    job = uow.jobs.get(event.job_id)
    if job is None or job.state is not JobState.CANCELLING:
        return
    deps.compute.signal_workers(job.job_id, job.attempt, deps.config.grace_period_s)


def hung(job: Job, event: JobInterruptRequested) -> str:
    """A restart for a hang (``shared.policies.hangs``) is remembered with its culprit's
    node; a job that hung before on another node hangs in its program: the reason says so
    and the job fails when its workers exit, its nodes not blamed."""
    if not event.reason.startswith(hangs.HANG_IN_JOB) or job.interrupt_requested_at is not None:
        return event.reason
    before = list(job.recovery.hung_on)
    job.recovery.hung_on = [*before, event.node_id][-KEEP_HANGS:]
    if not hangs.program_fault(before, event.node_id):
        return event.reason
    return (f"{hangs.PROGRAM_HANG}: the job hung on {', '.join(before)} and again on "
            f"{event.node_id}: the program's fault, not the nodes' ({event.reason})")


def _interrupt(job: Job, reason: str, uow: UnitOfWork, deps: Deps) -> None:
    if job.interrupt_requested_at is not None:
        return  # already told to checkpoint; a second SIGTERM would only cut its grace short
    job.interrupt_requested_at = deps.clock.now()
    job.interrupt_reason = reason
    deps.compute.signal_workers(job.job_id, job.attempt, deps.config.grace_period_s)
    uow.emit(JobSignalled(job_id=job.job_id, attempt=job.attempt,
                          grace_s=deps.config.grace_period_s, reason=reason))


def on_checkpoint_saved(event: JobCheckpointSaved, uow: UnitOfWork, deps: Deps) -> None:
    job = uow.jobs.get(event.job_id)
    if job is None:
        raise NotFound("job", event.job_id)
    tier = measure.tier_of(event)
    if tier is not Tier.DURABLE:  # a memory or peer entry: the recovery policy's input
        if measure.record_tier(job, event, tier):
            progress.progressed(job, event.attempt, event.saved_at)
            job.recovery.measured(event.attempt, event.saved_at)
        return
    if any(c.step == event.step for c in job.checkpoints):
        return
    job.recovery.measured(event.attempt, event.saved_at)  # (first progress, if no first step)
    job.checkpoints.append(Checkpoint(event.step, event.path, event.saved_at, event.attempt,
                                      max(0.0, event.save_s)))
    progress.progressed(job, event.attempt, event.saved_at)  # the watchdog's progress
    job.checkpoints.sort(key=lambda c: c.step)
    del job.checkpoints[:-KEEP_CHECKPOINTS]
    advise(job, event.path, deps)


def advise(job: Job, checkpoint_path: str, deps: Deps) -> None:
    """The checkpoint interval the job's own history calls for (Young/Daly from its observed
    MTBF and its measured save cost), in the job view and, where the deployment has one, in
    the environment file its program reads. Nothing without a measured save."""
    now = deps.clock.now()
    running = max(0.0, now - job.started_at) if job.started_at is not None else 0.0
    advice = checkpointing.advise([c.save_s for c in job.checkpoints], job.restart_count,
                                  running, now, deps.config.checkpoint)
    if advice is None:
        return
    job.checkpoint_advice = advice.as_dict()
    if deps.advice is not None:
        with contextlib.suppress(OSError):  # a file the program may read: best effort
            deps.advice.publish(checkpoint_path, job.job_id, advice.env())


def on_workers_exited(event: JobWorkersExited, uow: UnitOfWork, deps: Deps) -> None:
    job = uow.jobs.get(event.job_id)
    if job is None:
        raise NotFound("job", event.job_id)
    if event.attempt > job.attempt:  # its start is not visible yet: announced again by it
        if not job.terminal:
            job.recovery.hold_early_exit(event.attempt, event.exit_code, event.detail,
                                         event.storage_full, event.launch_failed)
        return
    if event.attempt != job.attempt or job.state not in (JobState.RUNNING, JobState.CANCELLING):
        return
    now = deps.clock.now()
    if job.state is JobState.CANCELLING:
        _release_nodes(job, uow, deps)
        job.transition(JobState.CANCELLED, now)
        _finished(job, uow, "cancelled by the user")
        return
    asked = job.interrupt_requested_at is not None
    if asked and job.interrupt_reason.startswith(hangs.PROGRAM_HANG):
        faulty = set(job_nodes.unsound(job, uow)) & set(job.recovery.hung_on)
        if not faulty:
            job.error = job.interrupt_reason
            _finish(job, JobState.FAILED, job.error, uow, deps)
            return
        # a node it hung on turned out faulty (a lost node stops its ranks as a hang does):
        # the hardware explains that hang, so it is no evidence against the program
        job.recovery.hung_on = [n for n in job.recovery.hung_on if n not in faulty]
    restart_anyway = job.spec.scheduling.restart_job_on_worker_restart
    node_fault, blamed = False, list[str]()
    unsound: list[str] | None = None  # the job's nodes with something against them
    if event.exit_code != 0 or asked:  # a crash: the program's, or a node's? (evidence)
        unsound = job_nodes.unsound(job, uow)
        node_fault, blamed = restarts.evidence(job, uow, unsound)
    disk_full = event.storage_full if event.exit_code not in (0, PREEMPTED_EXIT) else ""
    launch = event.launch_failed if event.exit_code in exits.NEVER_STARTED else ""
    if launch:
        blamed = []  # the platform failed to start a rank: no node ended this attempt
    interrupted = exits.infrastructure_ended(event.exit_code, interrupted=asked,
                                             node_fault=node_fault, storage_full=bool(disk_full),
                                             launch_failed=bool(launch))
    timed_out = timeouts.stopped_for_timeout(job) or timeouts.timed_out(job, now)
    verdict = exits.exit_verdict(event.exit_code, interrupted=interrupted,
                                 restart_anyway=restart_anyway, restarts=job.restart_count,
                                 max_restarts=job.spec.scheduling.max_restarts,
                                 timed_out=timed_out)
    if verdict is exits.Verdict.SUCCEEDED:
        _finish(job, JobState.SUCCEEDED, "all workers exited 0", uow, deps)
    elif verdict is exits.Verdict.FAILED:
        job.error = f"worker exited with {exits.describe(event.exit_code)}, the program's own " \
            f"failure (no interruption or node fault explains it): {event.detail}"
        _finish(job, JobState.FAILED, job.error, uow, deps)
    elif verdict is exits.Verdict.TIMED_OUT:
        job.error = timeouts.timeout_error(job)
        _finish(job, JobState.FAILED, job.error, uow, deps)
    elif disk_full and job.recovery.storage_full_times >= 1:  # filled it again: its own
        job.error = (f"the file system of the job's files ({disk_full}) was full again when "
                     f"its workers exited ({exits.describe(event.exit_code)}): a job that "
                     f"fills its disk a second time fails as its own failure: {event.detail}")
        _finish(job, JobState.FAILED, job.error, uow, deps)
    elif verdict is exits.Verdict.GAVE_UP:
        job.error = f"gave up after {job.restart_count} restarts"
        _finish(job, JobState.FAILED, job.error, uow, deps)
    else:
        # only the program's own ends climb the ladder: a node fault, a maintenance stop or
        # a preemption during a slow start is no sign of a bad restore (a long job on a big
        # fleet meets several in a row)
        ladder = None if interrupted else escalate.after_attempt(
            job, restarts.made_progress(job),
            f"exited with {exits.describe(event.exit_code)}: {event.detail}", deps)
        if ladder is not None and ladder.rung is None:  # restarted and restarted in vain
            job.error = escalate.evidence(job, ladder)
            _finish(job, JobState.FAILED, job.error, uow, deps)
            return
        suspects = [] if launch else restarts.after_failed_attempt(job, blamed, uow, deps)
        restarts.back_off(job, deps, launch_failed=bool(launch))
        if unsound is not None and suspects:  # they left the job's ranks
            unsound = [n for n in unsound if n not in suspects]
        reason = job.interrupt_reason or (f"{exits.LAUNCH_FAILED}: {launch}" if launch else
                                          f"workers exited with {exits.describe(event.exit_code)}")
        if disk_full:  # nowhere to write: it waits PENDING for room (job_submission checks)
            job.recovery.storage_full = disk_full
            job.recovery.storage_full_since = now
            job.recovery.storage_full_times += 1
            _requeue(job, storage.wait_reason(disk_full, reason), uow, deps, unsound)
        elif preempted(job):  # its nodes go to the team that reclaims them: all given back
            _requeue(job, reason, uow, deps, unsound, give_back=True)
        elif not modes.recover(job, unsound, reason, uow, deps, ladder):  # in place, hot swap...
            _requeue(job, reason, uow, deps, unsound)


def on_restored(event: JobRestored, uow: UnitOfWork, deps: Deps) -> None:
    """What an attempt's ranks restored: kept on the job, the evidence of a restart
    without progress (``escalate``); the event itself is the timeline's line."""
    job = uow.jobs.get(event.job_id)
    if job is None:
        raise NotFound("job", event.job_id)
    job.recovery.restored({"attempt": event.attempt, "step": event.step,
                           "tiers": list(event.tiers), "failed": list(event.failed),
                           "skipped": list(event.skipped)})


def _finish(job: Job, state: JobState, detail: str, uow: UnitOfWork, deps: Deps) -> None:
    _release_nodes(job, uow, deps)
    job.transition(state, deps.clock.now())
    _finished(job, uow, detail)


def preempted(job: Job) -> bool:
    """Stopped by fair share to give borrowed nodes back (``shared.policies.fair_share``)."""
    return job.interrupt_requested_at is not None \
        and job.interrupt_reason.startswith(f"{fair_share.PREEMPTION}:")


def _requeue(job: Job, reason: str, uow: UnitOfWork, deps: Deps,
             unsound: list[str] | None = None, *, give_back: bool = False) -> None:
    """Replace only what failed: nodes taken out of service leave the allocation, the healthy
    rest stay allocated to the job, and scheduling fills the holes (spares first).
    ``unsound``: the job's nodes that are not sound, when known (out of service ones are
    among them: the few to look at, not 2,048 ranks). ``give_back``: every node leaves
    (a preempted job is placed again through its team's queue)."""
    out = job_nodes.out_of_service(job, uow)
    gone = set(job.node_ids) if give_back \
        else out.intersection(job.node_ids if unsound is None else unsound)
    gone.discard("")
    _release(ranks.in_rank_order(gone, job.node_ids), job.job_id, uow, deps)
    gangs.regrow(job)  # a scaled-down job is requeued at its full size
    job.transition(JobState.PENDING, deps.clock.now())
    job.restart_count += 1
    held = job.node_ids  # a running job has no holes: the same value, shared
    job.previous_node_ids = ranks.Ranks(filter(None, held)) if ranks.holes(held) else held
    job.node_ids = ranks.with_holes(job.node_ids, gone)
    job.interrupt_requested_at = None
    job.interrupt_reason = ""
    uow.emit(JobRequeued(job_id=job.job_id, cluster_id=job.cluster_id,
                         restart_count=job.restart_count, reason=reason))


def _release_nodes(job: Job, uow: UnitOfWork, deps: Deps) -> None:
    _release(list(filter(None, job.node_ids)), job.job_id, uow, deps)


_release = release


def _release_orphan(node_id: str, uow: UnitOfWork, deps: Deps) -> None:
    """A draining node whose job is already gone must not wait forever."""
    node = uow.nodes.get(node_id)
    if node is None or node.state is not NodeState.DRAINING:
        return
    job = uow.jobs.get(node.job_id) if node.job_id else None
    if job is not None and job.state in (JobState.RUNNING, JobState.CANCELLING) \
            and node_id in job.node_ids:
        return
    if job is not None and job.state is JobState.PENDING and node_id in job.node_ids:
        job.node_ids = ranks.with_holes(job.node_ids, {node_id})  # held, now lost
    if lifecycle.release_from_job(node, None, deps.clock.now()):
        uow.emit(NodeDrained(node_id=node.node_id, reason=node.reason))


def _finished(job: Job, uow: UnitOfWork, detail: str) -> None:
    uow.emit(JobFinished(job_id=job.job_id, cluster_id=job.cluster_id, state=job.state.value,
                         restart_count=job.restart_count, detail=detail))


def on_node_returned(event: NodeReturnedToService, uow: UnitOfWork, deps: Deps) -> None:
    """A node is back: a scaled-down job may grow again (``modes.grow_where_ready``)."""
    modes.grow_where_ready(event.cluster_id, uow, deps)


def on_fleet_ticked(event: FleetTicked, uow: UnitOfWork, deps: Deps) -> Outcome | None:
    """The tick looks again for spares for scaled-down jobs (a spare may have come without a
    return to service: a provisioned replacement, a job that ended)."""
    modes.grow_where_ready(event.cluster_id, uow, deps)
    return None if uow.emitted else Outcome.UNCHANGED


SUBSCRIPTIONS = {
    NodeDraining: on_node_draining,
    JobInterruptRequested: on_interrupt_requested,
    JobCancelRequested: on_cancel_requested,
    JobCheckpointSaved: on_checkpoint_saved,
    JobWorkersExited: on_workers_exited,
    JobFirstStep: measure.on_first_step,
    JobRestored: on_restored,
    NodeReturnedToService: on_node_returned,
    FleetTicked: on_fleet_ticked,
}
