"""Active checks on idle nodes (policy: ``shared.policies.active_checks``).

- ``start_due`` (the periodic tick, after scheduling placed what it could): the idle nodes
  the policy picks get an ``ActiveCheck`` condition "running <key>" and compute is asked to
  check them (``shared.ports.ActiveChecks``). A backend without the capability checks none.
- ``yield_to_job`` (a placement, ``shared.service_layer.gangs.start_attempt``): a check in
  flight on a node a job now takes is cancelled; the job never waits for it.
- ``record`` (health triage, a report from source ``active-check``): the check is done, its
  time kept for the interval. The report's conditions (KnownAnswerMismatch, DcgmDiagFailed,
  ThermalThrottling) are triaged like any report: a finding goes through the triage table.
"""

from __future__ import annotations

from shared.domain.health import ConditionStatus, HealthReport
from shared.domain.model import Node, NodeCondition, NodeRole, NodeState
from shared.handling import Deps
from shared.policies.active_checks import IdleNode, budget, pick
from shared.ports import ActiveChecks, UnitOfWork

ACTIVE_CHECK = "ActiveCheck"  # the bookkeeping condition on the node (set by mtc)
RUNNING = "running"
KEY = "active_check_key"  # the details key an active check's conditions carry


def _running(node: Node) -> str | None:
    """The key of the check in flight on the node, if any."""
    cond = node.conditions.get(ACTIVE_CHECK)
    if cond is None or not cond.reason.startswith(RUNNING + " "):
        return None
    return cond.reason.split(" ", 1)[1]


def _last_checked(node: Node) -> float | None:
    cond = node.conditions.get(ACTIVE_CHECK)
    return cond.last_seen if cond is not None else None


def start_due(cluster_id: str, uow: UnitOfWork, deps: Deps) -> list[str]:
    """Start the checks the budget allows now; the nodes started."""
    config = deps.config.active_checks
    if not config.enabled or not isinstance(deps.compute, ActiveChecks):
        return []
    if budget(len(uow.nodes.ids(cluster_id, state=NodeState.IDLE)), config) < 1:
        return []  # (keys only: a small or busy fleet decodes no node for this)
    now = deps.clock.now()
    idle = [n for n in uow.nodes.list(cluster_id, state=NodeState.IDLE)
            if n.role is NodeRole.WORKER and not n.fault]
    chosen = pick([IdleNode(n.node_id, _last_checked(n), _running(n) is not None)
                   for n in idle], now, config)
    by_id = {n.node_id: n for n in idle}
    for node_id in chosen:
        key = f"{node_id}@{now:.0f}"
        by_id[node_id].conditions[ACTIVE_CHECK] = NodeCondition(
            ConditionStatus.UNKNOWN.value, f"{RUNNING} {key}", now, now)
        deps.compute.start_active_check(node_id, key)
    return list(chosen)


def yield_to_job(node: Node, deps: Deps) -> None:
    """A job takes the node: its check in flight, if any, is cancelled (never waited for)."""
    key = _running(node)
    if key is None:
        return
    now = deps.clock.now()
    node.conditions[ACTIVE_CHECK] = NodeCondition(
        ConditionStatus.UNKNOWN.value, f"cancelled {key}: a job took the node", now, now)
    if isinstance(deps.compute, ActiveChecks):
        deps.compute.cancel_active_check(node.node_id, key)


def record(node: Node, report: HealthReport, now: float) -> bool:
    """The results of the check in flight: done (and when), whatever they found. Results of
    a cancelled or older check change nothing here (triage still reads them)."""
    keys = {c.details.get(KEY) for c in report.conditions}
    key = _running(node)
    if key is None or keys != {key}:
        return False
    failed = any(c.status is ConditionStatus.TRUE for c in report.conditions)
    # (FALSE either way: the bookkeeping is no fault; the findings are their own conditions)
    node.conditions[ACTIVE_CHECK] = NodeCondition(
        ConditionStatus.FALSE.value, f"{'found faults' if failed else 'passed'} {key}", now,
        now)
    return True
