"""Health triage: a health report in, a diagnosis (or a return to service) out.

Decisions are state-based: a report for a node already out of service changes nothing, an
older report arriving after a newer one is ignored, so replays and XID storms cannot
re-drain a node that was repaired since.
"""

from __future__ import annotations

from shared.domain.errors import NotFound
from shared.domain.events import (
    FleetTicked,
    NodeDiagnosed,
    NodeHealthReported,
    NodeReturnedToService,
)
from shared.domain.health import (
    Condition,
    ConditionStatus,
    ConditionType,
    HealthReport,
    RepairAction,
)
from shared.domain.model import Node, NodeRole, NodeState
from shared.handling import Deps
from shared.policies.repair import ready_to_return
from shared.policies.triage import triage, unconfirmed_sightings
from shared.ports import UnitOfWork

SERVICE = "health_triage"
SYNTHETIC_SOURCES = frozenset({"heartbeat-monitor"})
MAX_HISTORY = 50
# states in which a fresh diagnosis can still change what happens to the node
ACTIONABLE = frozenset({NodeState.IDLE, NodeState.ALLOCATED, NodeState.SUSPECT,
                        NodeState.VERIFYING})


def on_health_reported(event: NodeHealthReported, uow: UnitOfWork, deps: Deps) -> None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        raise NotFound("node", event.node_id)
    conditions = tuple(Condition.from_dict(c) for c in event.conditions)
    report = HealthReport(event.node_id, event.observed_at, conditions, event.source)
    assess(node, report, uow, deps)


def assess(node: Node, report: HealthReport, uow: UnitOfWork, deps: Deps) -> None:
    if node.state in (NodeState.RETIRED,) or node.role is NodeRole.LOGIN:
        return
    synthetic = report.source in SYNTHETIC_SOURCES
    if not synthetic:
        if node.last_report_at is not None and report.observed_at < node.last_report_at:
            return  # reordered: a newer report was already assessed
        node.last_report_at = report.observed_at
    now = deps.clock.now()
    table = deps.config.triage_table
    diagnosis = triage(report, node.history, now, table)
    # first sightings of faults that act only when confirmed (slow, hot): remembered so the
    # next report can confirm them; their action is NONE, so the repair ladder ignores them
    node.history.extend(unconfirmed_sightings(report, node.history, now, table))
    del node.history[:-MAX_HISTORY]
    node.last_diagnosis = diagnosis.failure_mode
    if diagnosis.healthy:
        _count_pass(node, report, uow, deps)
        return
    if diagnosis.action is RepairAction.NONE:
        return  # a warning or an unknown check: noted, nothing to do
    if node.state not in ACTIONABLE:
        return  # already being drained or repaired: the same fault must not act twice
    if node.state is NodeState.VERIFYING:
        node.passes, node.first_pass_at = 0, None
    uow.emit(NodeDiagnosed(
        node_id=node.node_id,
        observed_at=report.observed_at,
        failure_mode=diagnosis.failure_mode,
        severity=diagnosis.severity.value,
        action=diagnosis.action.value,
        reasons=diagnosis.reasons,
        unmapped_xids=diagnosis.unmapped_xids,
    ))


def _count_pass(node: Node, report: HealthReport, uow: UnitOfWork, deps: Deps) -> None:
    """Hysteresis: a repaired or new node returns only after enough consecutive passes."""
    now = deps.clock.now()
    if node.state is NodeState.SUSPECT:
        node.transition(NodeState.ALLOCATED if node.job_id else NodeState.IDLE, now,
                        "healthy again")
        return
    if node.state is not NodeState.VERIFYING:
        return
    node.passes += 1
    if node.first_pass_at is None:
        node.first_pass_at = report.observed_at
    if not ready_to_return(node.passes, node.first_pass_at, now, deps.config.repair):
        return
    node.transition(NodeState.IDLE, now, "passed its checks")
    deps.compute.uncordon(node.node_id)
    partition = uow.partitions.get(node.cluster_id, node.partition)
    if partition is not None:
        partition.put_back(node.node_id)
    uow.emit(NodeReturnedToService(node_id=node.node_id, cluster_id=node.cluster_id))


def on_fleet_ticked(event: FleetTicked, uow: UnitOfWork, deps: Deps) -> None:
    """Nodes whose agent went silent are reported by the monitor, then triaged as usual."""
    now = deps.clock.now()
    timeout = deps.config.heartbeat_timeout_s
    watched = (NodeState.IDLE, NodeState.ALLOCATED, NodeState.SUSPECT)
    for node in uow.nodes.list(event.cluster_id):
        if node.state not in watched or node.role is NodeRole.LOGIN:
            continue
        last = node.last_report_at if node.last_report_at is not None else node.since
        silent = now - last
        if silent <= timeout:
            continue
        condition = Condition(ConditionType.HEARTBEAT_LOST.value, ConditionStatus.TRUE,
                              f"no report for {silent:.0f} s", now, {"silent_for_s": silent})
        assess(node, HealthReport(node.node_id, now, (condition,), "heartbeat-monitor"), uow,
               deps)


SUBSCRIPTIONS = {
    NodeHealthReported: on_health_reported,
    FleetTicked: on_fleet_ticked,
}
