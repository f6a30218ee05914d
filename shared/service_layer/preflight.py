"""Preflight of a gang before it runs (policy: ``shared.policies.preflight``).

Scheduling calls ``check`` with a job and the nodes placement just gave it, before the
attempt starts. When the cluster's mode asks for one and the start needs one (the first, or a
restart on new nodes), compute runs it among exactly the job's nodes (``shared.ports.
Preflight``); each culprit is reported as a health report from source ``preflight`` (health
triage records the condition on the node and the repair ladder acts, as on any fault), kept
out of the job's next placement, and the job is placed again. ``JobPreflightChecked`` records
the time spent: scheduling badput in the goodput accounting (cause ``preflight``).

A backend without the capability, or a run that could not judge, lets the job start: the
event says so, never a pass it did not run.
"""

from __future__ import annotations

import logging

from shared.domain import lifecycle, ranks
from shared.domain.events import JobPreflightChecked, NodeDrained, NodeHealthReported
from shared.domain.health import PREFLIGHT_SOURCE, ConditionType
from shared.domain.model import Job
from shared.handling import Deps
from shared.policies.preflight import Culprit, culprits, plan_for, wanted
from shared.ports import Preflight, UnitOfWork
from shared.probes.conditions import problem
from shared.service_layer.gangs import pool_counts

log = logging.getLogger(__name__)


def check(job: Job, placed: list[str], uow: UnitOfWork, deps: Deps) -> tuple[str, ...]:
    """Preflight ``job`` on its nodes with ``placed`` filling its holes; the nodes that
    failed (excluded from the job, reported), empty when the attempt may start."""
    if not wanted(job.attempt, placed):
        return ()
    cluster = uow.clusters.get(job.cluster_id)
    plan = plan_for(cluster.spec.labels) if cluster is not None else None
    if plan is None:
        return ()
    node_ids = tuple(ranks.fill_holes(job.node_ids if job.node_ids
                                      else ("",) * sum(pool_counts(job)), placed))
    started = deps.clock.now()
    if not isinstance(deps.compute, Preflight):
        uow.emit(JobPreflightChecked(job.job_id, node_ids, started, started, plan.mode,
                                     detail="not run: this compute backend runs no preflight"))
        return ()
    result = deps.compute.run_preflight(job.job_id, node_ids, plan)
    # (a backend that prices the run instead of blocking, the twin, says when it ends)
    started = max(started, result.started_at) if result.ran else started
    finished = max(started, deps.clock.now(), result.finished_at if result.ran else started)
    bad = culprits(result, plan)
    uow.emit(JobPreflightChecked(job.job_id, node_ids, started, finished, plan.mode,
                                 tuple(c.node_id for c in bad), result.detail))
    for culprit in bad:
        _report(job, culprit, finished, uow, deps)
    if bad:
        gone = {c.node_id for c in bad}
        job.recovery.excluded_node_ids = sorted({*job.recovery.excluded_node_ids, *gone})
        job.node_ids = ranks.with_holes(job.node_ids, gone) if job.node_ids else job.node_ids
        log.info("%s: preflight excluded %s", job.job_id, sorted(gone))
    return tuple(c.node_id for c in bad)


def _report(job: Job, culprit: Culprit, now: float, uow: UnitOfWork, deps: Deps) -> None:
    """The culprit's condition goes to triage as a report; a node the job held leaves it."""
    ctype = (ConditionType.COLLECTIVE_BANDWIDTH_LOW if culprit.collective
             else ConditionType.KNOWN_ANSWER_MISMATCH)  # (no GPU: DCGM's stand-in)
    details = {"job_id": job.job_id, "corrupt": culprit.corrupt or not culprit.collective,
               "busbw_gbps": culprit.busbw_gbps, "cause": "preflight"}
    cond = problem(ctype.value, now, culprit.reason, details)
    uow.emit(NodeHealthReported(culprit.node_id, now, (cond.to_dict(),), PREFLIGHT_SOURCE))
    node = uow.nodes.get(culprit.node_id)
    if node is not None and node.job_id == job.job_id and lifecycle.release_from_job(
            node, job.job_id, now, culprit.reason):
        uow.emit(NodeDrained(node_id=node.node_id, reason=node.reason))
