"""A straggler's diagnosis (``slow_in_job``) is acted on only when moving the node is cheaper
than keeping it: the job's measured recovery costs (``shared.service_layer.recovery_costs``), the
capacity a recovery would have now, and the time the job has left go into the pure policy
(``shared.policies.stragglers.decide``). A "wait" changes nothing; triage diagnoses the still
slow node again once per ``alert_reminder_s``, and it is weighed again then."""

from __future__ import annotations

from shared.domain.events import NodeDiagnosed
from shared.domain.model import Node
from shared.handling import Deps
from shared.policies import stragglers
from shared.ports import UnitOfWork
from shared.service_layer import capacity, recovery_costs


def weigh(node: Node, event: NodeDiagnosed, uow: UnitOfWork, deps: Deps
          ) -> stragglers.Verdict | None:
    """The verdict for a straggler's node in a running job; None: not a straggler's
    diagnosis, or nothing to weigh (no job, no ratio): the table's action stands."""
    if event.failure_mode != stragglers.SLOW_IN_JOB or not node.job_id:
        return None
    ratio = stragglers.ratio_from(event.reasons)
    job = uow.jobs.get(node.job_id)
    if ratio is None or job is None or job.recovery.attempt_started_at is None:
        return None
    now = deps.clock.now()
    config = deps.config.stragglers
    left = stragglers.remaining_s(now, job.started_at, job.spec.scheduling.timeout_s, config)
    costs = recovery_costs.costs(job, now, deps)
    cap = capacity.capacity_without(job, {node.node_id}, uow, deps)
    return stragglers.decide(ratio, left, node.node_id, costs, cap, False, config)
