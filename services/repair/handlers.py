"""Repair: a diagnosis in, drain / reset / reboot / reimage / replace out.

The ladder, lemon detection and the blast-radius guard are policy (shared/policies/repair);
the node lifecycle rules are domain (shared/domain/lifecycle); this module loads, decides
and emits. A held repair or a node that needs a person raises its alert (NodeRepairHeld)
once, and again only when the hold changes or after ``alert_reminder_s``.

A completed reimage (or replace) opens the deep-check gate
(``shared.service_layer.deep_checks``) when policy asks for it: the node stays VERIFYING until
DCGM level 2/3 and the collective test pass (or, by policy, could not run), and a failed check
is diagnosed and repaired like any.

This service owns **taking nodes out of service**: cordon, drain, repair, replace. Returning
a repaired node to service (the passing checks, the uncordon) belongs to health_triage.
"""

from __future__ import annotations

from dataclasses import replace

from services.repair import domains, stragglers
from shared.domain import lifecycle
from shared.domain.errors import NotFound
from shared.domain.events import (
    JobInterruptRequested,
    NodeDiagnosed,
    NodeDrained,
    NodeDraining,
    NodeRepairCompleted,
    NodeRepairHeld,
    NodeRepairStarted,
    NodeRetired,
)
from shared.domain.health import Diagnosis, FailureRecord, RepairAction, Severity
from shared.domain.lifecycle import ACTIONABLE
from shared.domain.model import Node, NodeState, Partition
from shared.handling import Deps
from shared.policies.ranking import action_rank
from shared.policies.repair import (
    DecisionKind,
    PartitionView,
    next_rung_after_failure,
    plan_repair,
)
from shared.ports import UnitOfWork
from shared.service_layer import deep_checks

SERVICE = "repair"
DEEP_CHECK_TRIGGER = {RepairAction.REIMAGE: "reimage", RepairAction.REPLACE: "replace"}


def on_diagnosed(event: NodeDiagnosed, uow: UnitOfWork, deps: Deps) -> None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        raise NotFound("node", event.node_id)
    if node.state not in ACTIONABLE:
        return  # already out of service: the decision was taken
    now = deps.clock.now()
    if event.failure_mode == lifecycle.OPERATOR_DRAIN_MODE:  # a person's drain: no guard
        if lifecycle.operator_drained(node):  # (not lifted since)
            operator_drain(node, uow, deps, node.conditions[lifecycle.OPERATOR_DRAIN].reason)
        return
    if node.state is NodeState.VERIFYING and node.repair_action is RepairAction.MANUAL:
        _fail(node, f"failed its checks after an operator returned it: {event.failure_mode}",
              uow, deps)  # returned by a person: back to them, not up the ladder
        return
    diagnosis = Diagnosis(event.failure_mode, Severity(event.severity),
                          RepairAction(event.action), event.reasons, event.unmapped_xids)
    held = node.repair_action if node.state is NodeState.SUSPECT else None
    if held is not None and action_rank(held) > action_rank(diagnosis.action):
        # a repair the guard held is still owed when the node, still sick, is diagnosed
        # again with a lesser action (a suspect whose XID only asks for a job restart):
        # planning the lesser one dropped the held repair and lost the node for good
        diagnosis = replace(diagnosis, action=held)
    weighed = stragglers.weigh(node, event, uow, deps)
    if weighed is not None and not weighed.swap:
        node.reason = weighed.why  # kept in service: the slowdown costs less than moving it
        return
    partition = _partition(uow, node)
    if domains.drain_if_rack_failed(node, diagnosis, partition, uow, deps, _take_out):
        return  # its rack was drained as one (racks as a unit of failure)
    # a rack drained as one counts once, against the guard per domain, not node by node
    view = PartitionView(partition.name, partition.total_nodes,
                         frozenset(partition.out_of_service - partition.drained_node_ids()),
                         tuple(partition.removed_at), settling=partition.settling)
    decision = plan_repair(diagnosis, node.history, view, node.node_id, now, deps.config.repair)
    reason = decision.reason
    if decision.kind is DecisionKind.NO_ACTION:
        return
    if decision.kind is DecisionKind.HOLD:
        lifecycle.hold(node, now, reason, decision.action)
        if lifecycle.alert_due(node, f"held:{decision.action.value}:{reason}", now,
                               deps.config.alert_reminder_s):
            uow.emit(NodeRepairHeld(node_id=node.node_id, action=decision.action.value,
                                    reason=decision.reason))
        return
    lifecycle.record_failure(node, FailureRecord(now, event.failure_mode, decision.action))
    if decision.kind is DecisionKind.RESTART_JOB:
        if node.job_id:
            job = uow.jobs.get(node.job_id)
            if job is not None:
                uow.emit(JobInterruptRequested(job_id=job.job_id, attempt=job.attempt,
                                               node_id=node.node_id, reason=reason))
        return
    _take_out(node, partition, decision.action, reason, uow, deps)


def _take_out(node: Node, partition: Partition, action: RepairAction, reason: str,
              uow: UnitOfWork, deps: Deps) -> None:
    deps.compute.cordon(node.node_id, reason)
    if lifecycle.take_out_of_service(node, partition, action, deps.clock.now(), reason,
                                     deps.config.repair.blast_window_s):
        assert node.job_id is not None
        uow.emit(NodeDraining(node_id=node.node_id, job_id=node.job_id, reason=reason))
        return
    _start(node, action, uow, deps, reason)


def release_held(node: Node, uow: UnitOfWork, deps: Deps, text: str) -> None:
    """An operator releases a hold: the repair the blast-radius guard held back runs now."""
    action = node.repair_action or RepairAction.REBOOT
    reason = f"{text}: {action} ({node.fault or node.reason})"
    lifecycle.record_failure(node, FailureRecord(deps.clock.now(), node.fault or "held", action))
    _take_out(node, _partition(uow, node), action, reason, uow, deps)


def operator_drain(node: Node, uow: UnitOfWork, deps: Deps, text: str) -> None:
    """An operator drains the node: its job checkpoints and moves, nothing repairs it."""
    deps.compute.cordon(node.node_id, text)
    if lifecycle.operator_drain(node, _partition(uow, node), deps.clock.now(), text,
                                deps.config.repair.blast_window_s):
        assert node.job_id is not None
        uow.emit(NodeDraining(node_id=node.node_id, job_id=node.job_id, reason=text))


def on_drained(event: NodeDrained, uow: UnitOfWork, deps: Deps) -> None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        raise NotFound("node", event.node_id)
    if node.state is not NodeState.DRAINED or node.retire_when_drained \
            or lifecycle.operator_drained(node):
        return  # (an operator's drain waits for an operator: no repair)
    _start(node, node.repair_action or RepairAction.REBOOT, uow, deps, node.reason)


def on_repair_completed(event: NodeRepairCompleted, uow: UnitOfWork, deps: Deps) -> None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        raise NotFound("node", event.node_id)
    if event.attempt > node.repair_attempt:  # its start is not visible yet: announced by it
        if node.state is not NodeState.RETIRED and (
                node.early_repair is None or event.attempt >= node.early_repair[0]):
            node.early_repair = (event.attempt, event.action, event.ok, event.detail)
        return
    if node.state is not NodeState.REPAIRING or event.attempt != node.repair_attempt:
        return  # a late result of an older attempt
    now = deps.clock.now()
    if event.ok:
        node.transition(NodeState.VERIFYING, now, f"{event.action} done; verifying")
        node.repair_action = RepairAction(event.action)
        # a reimaged (or replaced) node, or one that failed its deep checks before this
        # repair, passes them before it returns
        deep_checks.request(node, DEEP_CHECK_TRIGGER.get(node.repair_action, "repair"), deps)
        return
    escalated = next_rung_after_failure(RepairAction(event.action), deps.config.repair)
    node.transition(NodeState.REPAIRING, now, f"{event.action} failed: {event.detail}")
    _launch(node, escalated, uow, deps, f"{event.action} failed, escalating")


def _start(node: Node, action: RepairAction, uow: UnitOfWork, deps: Deps, reason: str) -> None:
    if action is not RepairAction.MANUAL:  # MANUAL goes from DRAINED straight to FAILED
        node.transition(NodeState.REPAIRING, deps.clock.now(), reason)
    _launch(node, action, uow, deps, reason)


def _launch(node: Node, action: RepairAction, uow: UnitOfWork, deps: Deps, reason: str) -> None:
    now = deps.clock.now()
    if action is RepairAction.MANUAL:
        _fail(node, reason, uow, deps)
        return
    if action is RepairAction.REPLACE:
        _replace(node, uow, deps, reason)
        return
    node.repair_action = action
    node.repair_attempt += 1
    lifecycle.renew(node, now)  # reports observed before this moment are stale from now on
    deps.compute.start_repair(node.node_id, action, node.repair_attempt)
    uow.emit(NodeRepairStarted(node_id=node.node_id, action=action.value,
                               attempt=node.repair_attempt, reason=reason))
    early = _take_early_repair(node)
    if early is not None:  # that repair already ran and answered before this commit
        uow.emit(early)


def _take_early_repair(node: Node) -> NodeRepairCompleted | None:
    """The result the node's just-started repair attempt already had (``Node.early_repair``);
    a held result of an older attempt is dropped, a newer one kept."""
    held = node.early_repair
    if held is None or held[0] > node.repair_attempt:
        return None
    node.early_repair = None
    if held[0] < node.repair_attempt:
        return None
    attempt, action, ok, detail = held
    return NodeRepairCompleted(node_id=node.node_id, action=action, attempt=attempt, ok=ok,
                               detail=detail)


def _fail(node: Node, reason: str, uow: UnitOfWork, deps: Deps) -> None:
    now = deps.clock.now()
    node.transition(NodeState.FAILED, now, f"needs a person: {reason}")
    node.repair_action = RepairAction.MANUAL
    if lifecycle.alert_due(node, f"failed:{reason}", now, deps.config.alert_reminder_s):
        uow.emit(NodeRepairHeld(node_id=node.node_id, action=RepairAction.MANUAL.value,
                                reason=reason))


def _replace(node: Node, uow: UnitOfWork, deps: Deps, reason: str) -> None:
    """Retire the bad node and provision a fresh one in its place (same pool, same role)."""
    now = deps.clock.now()
    replacement_id = replacement_name(node.node_id)
    lifecycle.retire(node, now, f"replaced: {reason}")
    partition = _partition(uow, node)
    partition.put_back(node.node_id)  # retired: it no longer counts against the partition
    if uow.nodes.get(replacement_id) is None:
        fresh = Node(
            node_id=replacement_id, cluster_id=node.cluster_id, pool=node.pool,
            partition=node.partition, role=node.role, machine_type=node.machine_type,
            accelerator_type=node.accelerator_type, accelerator_count=node.accelerator_count,
            state=NodeState.PROVISIONING, since=now, is_spare=node.is_spare,
            reason=f"replacing {node.node_id}", replaces=node.node_id,
            generation=node.generation, renewed_at=now, rack=node.rack,
            nvlink_domain=node.nvlink_domain, switch=node.switch,
        )
        uow.nodes.add(fresh)
        partition.take_out(fresh.node_id, now, deps.config.repair.blast_window_s)
        deps.compute.provision_node(fresh)
    deps.compute.delete_node(node.node_id)
    uow.emit(NodeRetired(node_id=node.node_id, reason=reason, replacement_id=replacement_id))


def replacement_name(node_id: str) -> str:
    """n-007 -> n-007-r1 -> n-007-r2: the lineage stays readable in `mtc node list`."""
    base, sep, gen = node_id.rpartition("-r")
    if sep and gen.isdigit():
        return f"{base}-r{int(gen) + 1}"
    return f"{node_id}-r1"


def _partition(uow: UnitOfWork, node: Node) -> Partition:
    partition = uow.partitions.get(node.cluster_id, node.partition)
    if partition is None:  # tolerate records created before partitions were tracked
        partition = Partition(node.cluster_id, node.partition,
                              total_nodes=len(uow.nodes.list(node.cluster_id,
                                                             partition=node.partition)))
        uow.partitions.add(partition)
    return partition



SUBSCRIPTIONS = {
    NodeDiagnosed: on_diagnosed,
    NodeDrained: on_drained,
    NodeRepairCompleted: on_repair_completed,
}
