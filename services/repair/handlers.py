"""Repair: a diagnosis in, drain / reset / reboot / reimage / replace out.

What a diagnosis leads to is one pure decision (shared/policies/repair_decision: a person's
drain, a straggler kept, a rack drained as one, then the ladder, lemon detection and the
blast-radius guard of shared/policies/repair); the node lifecycle rules are domain
(shared/domain/lifecycle); this module gathers the facts, applies the step and emits. A held
repair or a node that needs a person raises its alert (NodeRepairHeld) once, and again only
when the hold changes or after ``alert_reminder_s``.

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
from shared.domain.model import Node, NodeState, Partition
from shared.handling import Deps
from shared.policies import repair_decision
from shared.policies.repair import ROLLOUT_TRIGGER, PartitionView, next_rung_after_failure
from shared.policies.repair_decision import (
    FleetFacts,
    NodeFacts,
    RepairFacts,
    RepairStep,
    StepKind,
)
from shared.ports import UnitOfWork
from shared.service_layer import deep_checks, triage_policy

SERVICE = "repair"
DEEP_CHECK_TRIGGER = {RepairAction.REIMAGE: "reimage", RepairAction.REPLACE: "replace"}
HOST_REPORT = "reportFaultyHost"  # an operator's request (services.repair.faulty)


def on_diagnosed(event: NodeDiagnosed, uow: UnitOfWork, deps: Deps) -> None:
    node = uow.nodes.get(event.node_id)
    if node is None:
        raise NotFound("node", event.node_id)
    now = deps.clock.now()
    facts = _facts(node, event, uow, deps)
    step = repair_decision.decide(facts, now, deps.config.repair)
    # a candidate repair configuration's step on the same facts, recorded, never applied
    triage_policy.shadow_repair(node, facts, step, now, uow)
    _apply(step, facts, node, now, uow, deps)


def _facts(node: Node, event: NodeDiagnosed, uow: UnitOfWork, deps: Deps) -> RepairFacts:
    """What the decision reads: the node's own facts, then (only when those leave it open)
    its job's straggler weighing, its rack and its partition."""
    drain = node.conditions[lifecycle.OPERATOR_DRAIN].reason \
        if lifecycle.operator_drained(node) else None
    facts = RepairFacts(
        NodeFacts(node.node_id, node.state, node.repair_action, drain, node.rack,
                  tuple(node.history)),
        Diagnosis(event.failure_mode, Severity(event.severity), RepairAction(event.action),
                  event.reasons, event.unmapped_xids))
    if repair_decision.decided_by_node(facts):
        return facts
    partition = partition_of(uow, node)
    rack = domains.view(node, partition, uow) \
        if repair_decision.rack_matters(facts, deps.config.repair) else None
    # a rack drained as one counts once, against the guard per domain, not node by node
    view = PartitionView(partition.name, partition.total_nodes,
                         frozenset(partition.out_of_service - partition.drained_node_ids()),
                         tuple(partition.removed_at), settling=partition.settling)
    return replace(facts, fleet=FleetFacts(view, stragglers.weigh(node, event, uow, deps), rack))


def _apply(step: RepairStep, facts: RepairFacts, node: Node, now: float, uow: UnitOfWork,
           deps: Deps) -> None:
    """Carry out the decision's step on ``node``."""
    if step.rack_held is not None and facts.fleet is not None and facts.fleet.rack is not None:
        domains.hold(node, partition_of(uow, node), facts.fleet.rack, step.rack_held, uow)
    if step.failure is not None:
        lifecycle.record_failure(node, step.failure)
    kind = step.kind
    if kind is StepKind.OPERATOR_DRAIN:
        operator_drain(node, uow, deps, step.reason)
    elif kind is StepKind.FAIL:
        _fail(node, step.reason, uow, deps)
    elif kind is StepKind.KEEP:
        node.reason = step.reason  # kept in service: the slowdown costs less than moving it
    elif kind is StepKind.DRAIN_RACK:
        domains.drain(node, step, partition_of(uow, node), uow, deps, take_out)
    elif kind is StepKind.HOLD:
        assert step.action is not None
        lifecycle.hold(node, now, step.reason, step.action)
        if lifecycle.alert_due(node, f"held:{step.action.value}:{step.reason}", now,
                               deps.config.alert_reminder_s):
            uow.emit(NodeRepairHeld(node_id=node.node_id, action=step.action.value,
                                    reason=step.reason))
    elif kind is StepKind.RESTART_JOB:
        job = uow.jobs.get(node.job_id) if node.job_id else None
        if job is not None:
            uow.emit(JobInterruptRequested(job_id=job.job_id, attempt=job.attempt,
                                           node_id=node.node_id, reason=step.reason))
    elif kind is StepKind.REPAIR:
        assert step.action is not None
        take_out(node, partition_of(uow, node), step.action, step.reason, uow, deps)


def take_out(node: Node, partition: Partition, action: RepairAction, reason: str,
             uow: UnitOfWork, deps: Deps) -> None:
    """Cordon the node and take it out of service for ``action``: drained first when it
    runs a job (NodeDraining), else the repair starts at once."""
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
    take_out(node, partition_of(uow, node), action, reason, uow, deps)


def operator_drain(node: Node, uow: UnitOfWork, deps: Deps, text: str) -> None:
    """An operator drains the node: its job checkpoints and moves, nothing repairs it."""
    deps.compute.cordon(node.node_id, text)
    if lifecycle.operator_drain(node, partition_of(uow, node), deps.clock.now(), text,
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
        trigger = DEEP_CHECK_TRIGGER.get(node.repair_action, "repair")
        if node.repair_action is RepairAction.REIMAGE and node.software_target is not None:
            # the reimage wrote the staged version (a rollout's): the node carries it now
            node.software, node.software_target = node.software_target, None
            trigger = ROLLOUT_TRIGGER
        # a reimaged (or replaced) node, or one that failed its deep checks before this
        # repair, passes them before it returns
        deep_checks.request(node, trigger, deps)
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
    if action is RepairAction.REPLACE and not host_reported(node):
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


def host_reported(node: Node) -> bool:
    """An operator reported the node's host: the node keeps its name and spec and comes back
    on a repaired or new host (Compute Engine: ``reportHostAsFaulty``, then delete and insert
    under the same name), where a replace would retire it for a new one."""
    return node.operator_request.startswith(f"{HOST_REPORT}:")


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
    partition = partition_of(uow, node)
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


def partition_of(uow: UnitOfWork, node: Node) -> Partition:
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
