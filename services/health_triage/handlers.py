"""Health triage: a health report in, a diagnosis (or a return to service) out.

Conditions are state: a report is folded into the node's conditions first; one that changes
nothing (the same faults, the same verdict) refreshes "last seen" and ends there (no
diagnosis, no alert, and the bus leaves it out of the timeline: ``Outcome.UNCHANGED``). A
node still held with the same fault is diagnosed again once per ``alert_reminder_s``.

Decisions are state-based: a report for a node already out of service changes nothing, an
older report arriving after a newer one is ignored, and a report observed before the node's
last repair started (or before it was provisioned) is stale (``Outcome.STALE``, nothing
changes), so replays, redeliveries and XID storms cannot re-drain or escalate a node that
was repaired since. So is a report observed longer than ``max_event_age_s`` ago (an agent's
spool delivering late after a bus outage): it is recorded, never acted on.

This service owns **return to service**: it counts the passing checks (hysteresis), holds
a node whose deep-check gate is not clear (``shared.service_layer.deep_checks``: pending,
failed, or unknown under a "hold" policy; a deep check's results come as a report from source
``deep-check``, outside the agent's report order), moves the node back to IDLE and into its
partition, uncordons it in compute and announces it (NodeReturnedToService); it also releases
a held node that reports healthy. Taking nodes out of service (cordon, drain, repair) belongs
to the repair service. A node an operator drained (``DrainedByOperator``) never returns by
itself: a verified one is parked DRAINED until an operator resumes it
(``shared.service_layer.returns.resume``, shared with the repair service's operator
commands), and no agent report can lift the drain.
"""

from __future__ import annotations

from shared.domain import lifecycle
from shared.domain.errors import NotFound
from shared.domain.events import (
    FleetTicked,
    NodeDiagnosed,
    NodeHealthReported,
    NodeRepairHeld,
)
from shared.domain.health import (
    ACTIVE_CHECK_SOURCE,
    REMOTE_SOURCES,
    Condition,
    HealthReport,
    RepairAction,
)
from shared.domain.lifecycle import ACTIONABLE
from shared.domain.model import Node, NodeRole, NodeState
from shared.handling import Deps, Outcome
from shared.policies.repair import DEEP_CHECK_SOURCE, ready_to_return
from shared.ports import UnitOfWork
from shared.service_layer import active_checks, deep_checks, returns, triage_policy

SERVICE = "health_triage"
SYNTHETIC_SOURCES = REMOTE_SOURCES  # reports from outside the node are no heartbeat


def on_health_reported(event: NodeHealthReported, uow: UnitOfWork, deps: Deps
                       ) -> Outcome | None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        raise NotFound("node", event.node_id)
    if lifecycle.stale_report(node, event.observed_at):
        return Outcome.STALE  # from before its last repair (or provisioning): history
    if deps.clock.now() - event.observed_at > deps.config.max_event_age_s:
        # aged by when it was OBSERVED, whatever carried it: an agent's spool can send a
        # report hours late through a transport that stamps its own time (the API)
        return Outcome.STALE
    report = HealthReport(event.node_id, event.observed_at,
                          Condition.parse_all(event.conditions), event.source)
    return None if assess(node, report, uow, deps) else Outcome.UNCHANGED


def assess(node: Node, report: HealthReport, uow: UnitOfWork, deps: Deps) -> bool:
    """Triage ``report`` for ``node``; False when it changed nothing but "last seen"."""
    if node.state in (NodeState.RETIRED,) or node.role is NodeRole.LOGIN:
        return False
    synthetic = report.source in SYNTHETIC_SOURCES or report.source == DEEP_CHECK_SOURCE
    if not synthetic:
        if node.last_report_at is not None and report.observed_at < node.last_report_at:
            return False  # reordered: a newer report was already assessed
        node.last_report_at = report.observed_at
    before = (node.state, node.passes, len(node.history), node.last_diagnosis)
    drained = lifecycle.operator_drained(node)
    changed = lifecycle.observe(node, report)
    now = deps.clock.now()
    if report.source == DEEP_CHECK_SOURCE:  # the verdict that gates its return
        changed |= deep_checks.record(node, report, now)
    if report.source == ACTIVE_CHECK_SOURCE:  # an idle node's check is done
        changed |= active_checks.record(node, report, now)
    if drained and not lifecycle.operator_drained(node):  # they lifted their own drain
        returns.resume(node, uow, deps, node.conditions[lifecycle.OPERATOR_DRAIN].reason)
    # the active table decides, unless the cluster stages a candidate as active for this
    # cause on this partition (shadow and recommend-only record, never apply)
    diagnosis, sightings = triage_policy.triage(node, report, now, deps.config.triage_table,
                                                uow, new_fault=changed)
    lifecycle.note_fault(node, diagnosis.failure_mode, diagnosis.action, diagnosis.healthy)
    # first sightings of faults that act only when confirmed (slow, hot): remembered so the
    # next report can confirm them; their action is NONE, so the repair ladder ignores them
    lifecycle.record_failure(node, *sightings)
    if diagnosis.healthy:
        node.last_diagnosis = diagnosis.failure_mode
        _count_pass(node, report, uow, deps)
    elif diagnosis.action is RepairAction.NONE or node.state not in ACTIONABLE:
        node.last_diagnosis = diagnosis.failure_mode
    else:
        # (a warning or an unknown check is noted and does nothing; a node already being
        # drained or repaired must not act on the same fault twice)
        if lifecycle.diagnosis_due(node, diagnosis.failure_mode, diagnosis.action, changed,
                                   now, deps.config.alert_reminder_s):
            node.last_diagnosis = diagnosis.failure_mode
            if node.state is NodeState.VERIFYING:
                lifecycle.reset_passes(node)
            uow.emit(NodeDiagnosed(
                node_id=node.node_id,
                observed_at=report.observed_at,
                failure_mode=diagnosis.failure_mode,
                severity=diagnosis.severity.value,
                action=diagnosis.action.value,
                reasons=diagnosis.reasons,
                unmapped_xids=diagnosis.unmapped_xids,
            ))
            return True
    after = (node.state, node.passes, len(node.history), node.last_diagnosis)
    return changed or after != before


def _count_pass(node: Node, report: HealthReport, uow: UnitOfWork, deps: Deps) -> None:
    """Hysteresis: a repaired or new node returns only after enough consecutive passes."""
    now = deps.clock.now()
    if lifecycle.operator_drained(node):  # a person keeps it out: it never returns by itself
        lifecycle.park(node, now)
        return
    if lifecycle.release_hold(node, now):
        if node.state is NodeState.IDLE:  # free again: a job waiting for a node may start
            uow.emit(returns.returned(node))
        return
    if node.state is not NodeState.VERIFYING:
        return
    lifecycle.count_pass(node, report.observed_at)
    if not ready_to_return(node.passes, node.first_pass_at, now, deps.config.repair):
        return
    if not deep_checks.allows_return(node, deps):
        return  # deep checks pending, failed, or unknown under a "hold" policy
    lifecycle.return_to_service(node, uow.partitions.get(node.cluster_id, node.partition), now)
    deps.compute.uncordon(node.node_id)
    uow.emit(returns.returned(node))


def on_fleet_ticked(event: FleetTicked, uow: UnitOfWork, deps: Deps) -> Outcome | None:
    """Heartbeats are state: a node whose last report is older than the timeout gets a
    HeartbeatLost condition, once (on the change), then is triaged as usual. A FAILED node
    waits for a person, and says nothing more itself: the tick repeats its alert once per
    ``alert_reminder_s`` (the first was raised by repair when it failed)."""
    now = deps.clock.now()
    timeout = deps.config.heartbeat_timeout_s
    acted = False
    # one query per watched state: the nodes still coming up (most of a new cluster) are
    # never loaded
    watched = [n for state in sorted(lifecycle.WATCHED)
               for n in uow.nodes.list(event.cluster_id, state=state)]
    for node in watched:
        if node.role is NodeRole.LOGIN:
            continue
        condition = lifecycle.heartbeat_lost(node, now, timeout)
        if condition is None:
            continue
        acted |= assess(node, HealthReport(node.node_id, now, (condition,), "heartbeat-monitor"),
                        uow, deps)
    for node in uow.nodes.list(event.cluster_id, state=NodeState.FAILED):
        key = node.alert or f"failed:{node.reason}"
        if lifecycle.alert_due(node, key, now, deps.config.alert_reminder_s):
            uow.emit(NodeRepairHeld(node_id=node.node_id, action=RepairAction.MANUAL.value,
                                    reason=f"still needs a person: {node.reason}"))
            acted = True
    # recommendations nobody decided by their deadline take the configured default
    acted |= triage_policy.expire(uow, event.cluster_id, now)
    return None if acted else Outcome.UNCHANGED


SUBSCRIPTIONS = {
    NodeHealthReported: on_health_reported,
    FleetTicked: on_fleet_ticked,
}
