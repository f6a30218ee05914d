"""The recovery of an interrupted attempt: the policy picks the mode, this runs it.

When an attempt ends and the verdict is a restart (``handlers.on_workers_exited``), the
incident is read from the job's nodes: all still usable (a RESTART_JOB diagnosis, a hang, an
interruption with nothing taken out) is ``app_restart``; some out of service is
``node_repair``, gone ``node_lost``. ``shared.policies.recovery.choose`` picks the mode from
the job's measured costs (``recovery_costs``) and the capacity at hand (a spare placement can
fill the hole with now; the job's elasticity, labels ``mtc-min-replicas``); a pin (label
``mtc-recovery-mode`` on the job, else on its cluster) wins where allowed. Then:

* ``in_place``: attempt+1 starts on the same nodes at once (no PENDING, no backoff);
* ``hot_swap``: the nodes out of service leave (repair takes them, as today) and spares take
  their ranks at once; attempt+1 starts with the spares named fresh;
* ``scale_down``: the nodes out of service leave and attempt+1 starts on the rest with that
  many fewer replicas of the elastic pool; ``grow`` brings it back when a spare is ready;
* ``requeue``: the plain requeue (the caller requeues).

A choice is recorded (``JobRecoveryChosen``, ``Job.recovery.decisions``) whenever the policy
had one, or a pin asked; a requeue with no alternative is the plain requeue and records nothing.
A job restarting again and again without progress climbs the escalation ladder
(``escalate``): the modes its rung bars are not chosen, whatever they cost.
"""

from __future__ import annotations

from services.checkpoint_resume.release import release
from shared.domain import lifecycle, ranks
from shared.domain.events import JobRecoveryChosen, JobSignalled
from shared.domain.model import Job, JobState, Node, NodeState
from shared.handling import Deps
from shared.policies import recovery
from shared.policies.escalation import Step
from shared.policies.recovery import Decision, Incident, IncidentKind, Mode
from shared.ports import RecoveryPlan, UnitOfWork
from shared.service_layer import capacity, gangs, recovery_costs

GROW_REASON = "grow: a spare is ready for the scaled-down job"


def recover(job: Job, unsound: list[str] | None, reason: str, uow: UnitOfWork,
            deps: Deps, ladder: Step | None = None) -> bool:
    """Restart ``job`` (its attempt just ended, the verdict a restart) by the cheapest mode
    its rung on the escalation ladder allows (``ladder``; None: any). True when it did (the
    job stays RUNNING with attempt+1); False: the caller requeues."""
    if not deps.config.recovery.enabled or job.recovery.attempt_started_at is None:
        return False  # (an attempt started before this code kept no figures: the plain requeue)
    now = deps.clock.now()
    fault_at = job.interrupt_requested_at or now
    if job.interrupt_reason == GROW_REASON:
        return _grow(job, fault_at, uow, deps)
    gone = _gone(job, uow, unsound)
    incident = _incident(job, gone, uow, unsound)
    held = ranks.with_holes(job.node_ids, set(gone)) if gone else job.node_ids
    placed = capacity.spares(job, held, uow, deps) \
        if capacity.could_move(job) and ranks.holes(held) else []
    cap = capacity.for_recovery(job, held, placed, deps)
    pinned = recovery.pin_of(_label(job.spec.labels, recovery.MODE_LABEL),
                             _cluster_pin(job, uow))
    costs = recovery_costs.costs(job, fault_at, deps)
    decision = recovery.choose(incident, costs, cap, pinned)
    if decision.mode is Mode.REQUEUE and len(decision.expected_lost_s) == 1 and pinned is None:
        return False  # no alternative: the plain requeue, nothing to explain
    note = f"{ladder.why}; " if ladder is not None and ladder.why else ""
    if ladder is not None and decision.mode in ladder.barred:
        decision = recovery.choose(incident, costs, cap, pinned,
                                   dict.fromkeys(ladder.barred, "barred by the ladder"))
    _record(job, decision, incident.kind.value, note, fault_at, uow)
    if decision.mode is Mode.REQUEUE:
        return False
    _restart(job, decision.mode, gone, held, placed, uow, deps)
    return True


def _restart(job: Job, mode: Mode, gone: list[str], held: ranks.Ranks, placed: list[str],
             uow: UnitOfWork, deps: Deps) -> None:
    job.restart_count += 1
    job.previous_node_ids = job.node_ids
    job.interrupt_requested_at = None
    job.interrupt_reason = ""
    release(gone, job.job_id, uow, deps)  # out of service: repair takes them, as today
    plan = RecoveryPlan(mode.value)
    if mode is Mode.HOT_SWAP:
        job.node_ids = held
        plan = RecoveryPlan(mode.value, tuple(placed))
    elif mode is Mode.SCALE_DOWN:
        gangs.shrink(job, set(gone) | {""})
        placed = []
    else:
        placed = []
    gangs.start_attempt(job, placed, uow, deps, plan)


def _gone(job: Job, uow: UnitOfWork, unsound: list[str] | None) -> list[str]:
    """The job's nodes this attempt cannot use again, in rank order ('' for a rank a
    suspect already left)."""
    look = unsound if unsound is not None else [n for n in job.node_ids if n]
    out = [n for n in look if not _usable(uow.nodes.get(n), job)]
    return out + [""] * len(ranks.holes(job.node_ids))


def _usable(node: Node | None, job: Job) -> bool:
    return node is not None and node.job_id == job.job_id and lifecycle.takes_work(node)


def _incident(job: Job, gone: list[str], uow: UnitOfWork, unsound: list[str] | None
              ) -> Incident:
    if not gone:
        return Incident(IncidentKind.APP_RESTART, tuple(unsound or ()))
    lost = [n for n in gone if n and _lost(uow.nodes.get(n))]
    kind = IncidentKind.NODE_LOST if lost else IncidentKind.NODE_REPAIR
    return Incident(kind, tuple(gone))


def _lost(node: Node | None) -> bool:
    return node is None or node.state is NodeState.RETIRED


def _record(job: Job, decision: Decision, incident: str, note: str, fault_at: float,
            uow: UnitOfWork) -> None:
    expected = decision.expected() or 0.0
    why = note + decision.why
    job.recovery.decided({"at": fault_at, "attempt": job.attempt, "mode": decision.mode.value,
                          "incident": incident, "why": why,
                          "expected_lost_s": round(expected, 3), "measured_s": None})
    uow.emit(JobRecoveryChosen(job_id=job.job_id, attempt=job.attempt,
                               mode=decision.mode.value, incident=incident, reason=why,
                               expected_lost_s=round(expected, 3)))


def _label(labels: tuple[tuple[str, str], ...], key: str) -> str | None:
    return dict(labels).get(key)


def _cluster_pin(job: Job, uow: UnitOfWork) -> str | None:
    cluster = uow.clusters.get(job.cluster_id)
    return None if cluster is None else _label(cluster.spec.labels, recovery.MODE_LABEL)


# ------------------------------------------------------------------ growing back


def grow_where_ready(cluster_id: str, uow: UnitOfWork, deps: Deps) -> None:
    """Capacity may have come back: the cluster's scaled-down jobs ask to grow."""
    for job in uow.jobs.list(cluster_id, state=JobState.RUNNING):
        if job.recovery.replicas is not None:
            want_to_grow(job, uow, deps)


def want_to_grow(job: Job, uow: UnitOfWork, deps: Deps) -> None:
    """A scaled-down job with a spare ready for every replica it gave up: ask it to stop
    (SIGTERM, grace) so that it restarts at full size (``_grow``). Once per attempt."""
    if job.recovery.replicas is None or job.interrupt_requested_at is not None:
        return
    if not _spares_at_full_size(job, uow, deps):
        return
    job.interrupt_requested_at = deps.clock.now()
    job.interrupt_reason = GROW_REASON
    deps.compute.signal_workers(job.job_id, job.attempt, deps.config.grace_period_s)
    uow.emit(JobSignalled(job_id=job.job_id, attempt=job.attempt,
                          grace_s=deps.config.grace_period_s, reason=GROW_REASON))


def _spares_at_full_size(job: Job, uow: UnitOfWork, deps: Deps) -> list[str]:
    """The spares that would bring the job back to its spec's size now (the job is left
    as it is)."""
    replicas, node_ids = job.recovery.replicas, job.node_ids
    gangs.regrow(job)
    try:
        return capacity.spares(job, job.node_ids, uow, deps)
    finally:
        job.recovery.replicas, job.node_ids = replicas, node_ids


def _grow(job: Job, fault_at: float, uow: UnitOfWork, deps: Deps) -> bool:
    """The scaled-down attempt stopped to grow: spares take the replicas back (a hot swap:
    they start cold from the peer tier); without them (taken meanwhile) it goes on scaled
    down, on the same nodes."""
    placed = _spares_at_full_size(job, uow, deps)
    mode = Mode.HOT_SWAP if placed else Mode.SCALE_DOWN
    why = (f"grow: {len(placed)} spare(s) ready, back to full size" if placed
           else "grow: the spare was taken meanwhile, staying scaled down")
    decision = Decision(mode, ((mode, 0.0),), why)
    _record(job, decision, "grow", "", fault_at, uow)
    job.restart_count += 1
    job.previous_node_ids = job.node_ids
    job.interrupt_requested_at = None
    job.interrupt_reason = ""
    if placed:
        gangs.regrow(job)
    gangs.start_attempt(job, placed, uow, deps, RecoveryPlan(mode.value, tuple(placed)))
    return True
