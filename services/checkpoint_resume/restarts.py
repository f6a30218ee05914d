"""Checkpoint-resume's restart half: who ended an attempt, the backoff, repeat offenders.

An attempt that exited non-zero without the control plane asking is the program's failure
unless a node under it gives evidence (``shared.domain.exits``): lost (gone, not allocated
any more), taken out of service, or still in service with a fault present (a TRUE condition
that stops a job, HeartbeatLost from the heartbeat monitor included) or held SUSPECT.

The nodes still in service with evidence against them are remembered per failed attempt
(the node an interrupt names counts only by its own evidence: planned maintenance names a
node it does not blame). A node under ``offender_count`` of the last ``offender_window``
(``shared.policies.restarts``) is suspected: released from the job, held SUSPECT so nothing
is placed on it, kept out of the job's next placement, and handed to repair as a
``NodeDiagnosed`` (repair's ladder, lemon rule and blast-radius guard decide: take it out
and reboot it, or hold it). Nodes already out of service are repair's and not counted.
"""

from __future__ import annotations

from shared.domain import lifecycle, ranks
from shared.domain.events import NodeDiagnosed, NodeDrained
from shared.domain.health import NON_FATAL_CONDITIONS, ConditionStatus
from shared.domain.model import Job, Node, NodeState
from shared.handling import Deps
from shared.policies import restarts
from shared.ports import UnitOfWork
from shared.service_layer import job_nodes

# conditions that slow or warn but do not end an attempt (as the goodput accounting reads them)
NON_FATAL = NON_FATAL_CONDITIONS
_TRUE = ConditionStatus.TRUE.value


def faulty(node: Node) -> bool:
    """A node in service with a fault present that ends jobs (heartbeat lost included)."""
    return any(c.status == _TRUE and t not in NON_FATAL
               for t, c in node.conditions.items())


def evidence(job: Job, uow: UnitOfWork, unsound: list[str]) -> tuple[bool, list[str]]:
    """Whether a node under the attempt failed (lost, out of service, faulty), and the nodes
    still in service to blame for it (faulty, or held SUSPECT). ``unsound``: the job's
    nodes that are not sound and allocated to it (``job_nodes.unsound``), the only ones with
    anything against them (a node out of service is never sound)."""
    out = job_nodes.out_of_service(job, uow)
    # a sound node allocated to the job has nothing against it: only the others are read
    # (a keys-only query: a restart reads a handful of nodes, not all 2,048 of the job)
    lost = not out.isdisjoint(unsound)
    blamed: set[str] = set()
    for node_id in [n for n in unsound if n not in out]:
        node = uow.nodes.get(node_id)
        if node is None or node.state not in (NodeState.ALLOCATED, NodeState.SUSPECT):
            lost = True  # gone or taken out: repair has it already
        elif node.state is NodeState.SUSPECT or faulty(node):
            lost = True  # sick but still in service: to blame
            blamed.add(node_id)
    return lost, sorted(blamed)


def after_failed_attempt(job: Job, blamed: list[str], uow: UnitOfWork, deps: Deps) -> list[str]:
    """Remember the attempt's evidence; suspect the repeat offenders. Returns the suspects
    (released from the job by this call, held, diagnosed and excluded from its next
    placement)."""
    config = deps.config.restart
    rec = job.recovery
    rec.failed_on = restarts.remember_failure(rec.failed_on, blamed, config)
    suspects = [n for n in restarts.repeat_offenders(rec.failed_on, config) if n in job.node_ids]
    now = deps.clock.now()
    for node_id in suspects:
        node = uow.nodes.get(node_id)
        if node is None:
            continue
        reason = restarts.suspect_reason(node_id, job.job_id, rec.failed_on)
        if lifecycle.release_from_job(node, job.job_id, now, "suspected"):
            uow.emit(NodeDrained(node_id=node.node_id, reason=node.reason))
        lifecycle.hold(node, now, reason)
        uow.emit(NodeDiagnosed(node_id=node_id, observed_at=now,
                               failure_mode=restarts.SUSPECT_FAILURE_MODE,
                               severity=restarts.SUSPECT_SEVERITY.value,
                               action=restarts.SUSPECT_ACTION.value, reasons=(reason,)))
    if suspects:
        rec.failed_on = restarts.forget(rec.failed_on, suspects)
        rec.excluded_node_ids = sorted(set(rec.excluded_node_ids) | set(suspects))
        job.node_ids = ranks.with_holes(job.node_ids, set(suspects))
    return suspects


def back_off(job: Job, deps: Deps, launch_failed: bool = False) -> None:
    """Count the restart in the streak and set when it may start. A restart because the
    platform could not start a rank (``launch_failed``) says nothing of the program's
    progress: it leaves the streak alone and backs off by its own count (the first at once,
    so a repair's race costs nothing; the platform failing again and again does not spin)."""
    rec = job.recovery
    if launch_failed:
        rec.launch_failures += 1
        rec.not_before = restarts.not_before(deps.clock.now(), rec.launch_failures,
                                             deps.config.restart)
        return
    rec.launch_failures = 0
    rec.streak = restarts.next_streak(rec.streak, made_progress(job))
    rec.not_before = restarts.not_before(deps.clock.now(), rec.streak, deps.config.restart)


def made_progress(job: Job) -> bool:
    """The running attempt saved a checkpoint, durable or on a near tier."""
    return any(c.attempt == job.attempt for c in job.checkpoints) \
        or any(t.get("attempt") == job.attempt for t in job.recovery.tiers.values())
