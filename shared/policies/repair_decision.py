"""What repair does about one diagnosis: the decision ``services.repair.handlers.on_diagnosed``
applies. Pure: the handler gathers the facts, passes the time in, and carries out the step.

The rules, in order; the first that decides wins:

==  ====================================================  ======================================
1   the node is out of service already (not ACTIONABLE)   NONE: the decision was taken
2   a person's drain (``drained_by_operator``)            OPERATOR_DRAIN while it stands, else
                                                          NONE; never guarded: a person decided
3   it failed its checks after a person returned it       FAIL: back to them, not up the ladder
    (VERIFYING after a MANUAL repair)
4   a straggler whose slowdown costs less than a move     KEEP: it stays in service, the
    (``shared.policies.stragglers``)                      weighing's why on the node
5   its rack is bad enough to go as one                   DRAIN_RACK (``shared.policies.
    (``shared.policies.domains``)                         domains``); a rack the guard per
                                                          domain holds raises its one alert
                                                          (``rack_held``) and goes on to 6
6   the per-node policy: ladder, lemon, blast-radius      NONE, HOLD, RESTART_JOB or REPAIR
    guard (``shared.policies.repair.plan_repair``)        (``PER_NODE``)
==  ====================================================  ======================================

Before rules 4-6, a repair the guard held is still owed: a SUSPECT node diagnosed again with a
lesser action (a suspect whose XID only asks for a job restart) keeps the held one, since
planning the lesser one would drop the held repair and lose the node for good (``owed``).

Rules 1-3 read the node alone (``decided_by_node``): the handler reads the node's job, rack and
partition (``FleetFacts``) only when they are left open.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from shared.domain.health import Diagnosis, FailureRecord, RepairAction
from shared.domain.lifecycle import ACTIONABLE, OPERATOR_DRAIN_MODE
from shared.domain.model import NodeState
from shared.policies.domains import DOMAIN_ACTION, DomainDecisionKind, DomainView, plan_domain
from shared.policies.ranking import action_rank
from shared.policies.repair import DecisionKind, PartitionView, RepairConfig, plan_repair
from shared.policies.stragglers import Verdict


@dataclass(frozen=True)
class NodeFacts:
    """What the node itself says."""

    node_id: str
    state: NodeState
    repair_action: RepairAction | None  # held back by the guard (SUSPECT), or its last repair
    operator_drain: str | None  # a person's drain reason while their drain stands
    rack: str = ""
    history: tuple[FailureRecord, ...] = ()


@dataclass(frozen=True)
class FleetFacts:
    """What the node's job, rack and partition say, read when the node alone leaves it open."""

    partition: PartitionView
    straggler: Verdict | None = None  # the weighing of a straggler in a running job
    rack: DomainView | None = None  # the node's rack, when a rack can go as one (``rack_matters``)


@dataclass(frozen=True)
class RepairFacts:
    node: NodeFacts
    diagnosis: Diagnosis  # as triage made it
    fleet: FleetFacts | None = None


class StepKind(enum.StrEnum):
    NONE = "none"  # nothing to do
    OPERATOR_DRAIN = "operator_drain"  # cordon and drain for a person: no repair
    FAIL = "fail"  # FAILED: it needs a person
    KEEP = "keep"  # stays in service: ``reason`` goes on the node
    DRAIN_RACK = "drain_rack"  # the rack drains as one; the node takes ``action``
    HOLD = "hold"  # the blast-radius guard holds ``action`` back: the node stays, an alert
    RESTART_JOB = "restart_job"  # no node action: the job running on it restarts
    REPAIR = "repair"  # take the node out and run ``action``


# the per-node policy's decision -> the step (rule 6)
PER_NODE: dict[DecisionKind, StepKind] = {
    DecisionKind.NO_ACTION: StepKind.NONE,
    DecisionKind.HOLD: StepKind.HOLD,
    DecisionKind.RESTART_JOB: StepKind.RESTART_JOB,
    DecisionKind.REPAIR: StepKind.REPAIR,
}
# the steps that count as a failure in the node's history (the ladder and lemon read it)
RECORDED = frozenset({StepKind.DRAIN_RACK, StepKind.RESTART_JOB, StepKind.REPAIR})


@dataclass(frozen=True)
class RepairStep:
    kind: StepKind
    reason: str = ""
    action: RepairAction | None = None
    failure: FailureRecord | None = None  # recorded on the node before the step is carried out
    rack_held: str | None = None  # the guard per domain holds the rack: its alert's reason


def owed(facts: RepairFacts) -> Diagnosis:
    """The diagnosis with the repair the guard held still owed (never a lesser action)."""
    node, diagnosis = facts.node, facts.diagnosis
    held = node.repair_action if node.state is NodeState.SUSPECT else None
    if held is not None and action_rank(held) > action_rank(diagnosis.action):
        return replace(diagnosis, action=held)
    return diagnosis


def rack_matters(facts: RepairFacts, config: RepairConfig) -> bool:
    """Whether the node's rack can go as one for this diagnosis (rule 5's question)."""
    return config.domain_drain_fraction > 0 and bool(facts.node.rack) \
        and owed(facts).action.takes_node_out


def decided_by_node(facts: RepairFacts) -> bool:
    """Rules 1-3 decide from the node alone: its job, rack and partition need not be read."""
    return _by_node(facts) is not None


def decide(facts: RepairFacts, now: float, config: RepairConfig) -> RepairStep:
    """The one step for ``facts`` at ``now`` (the rules above)."""
    step = _by_node(facts)
    if step is not None:
        return step
    fleet = facts.fleet
    if fleet is None:
        raise ValueError("the node leaves the decision open: its fleet facts are needed")
    if fleet.straggler is not None and not fleet.straggler.swap:
        return RepairStep(StepKind.KEEP, fleet.straggler.why)
    diagnosis = owed(facts)
    rack_held = None
    if fleet.rack is not None and rack_matters(facts, config):
        domain = plan_domain(fleet.rack, facts.node.node_id, config)
        if domain.kind is DomainDecisionKind.DRAIN:
            own = diagnosis.action if action_rank(diagnosis.action) >= action_rank(DOMAIN_ACTION) \
                else DOMAIN_ACTION
            return RepairStep(StepKind.DRAIN_RACK, domain.reason, own,
                              FailureRecord(now, diagnosis.failure_mode, own))
        if domain.kind is DomainDecisionKind.HOLD:
            rack_held = domain.reason
    decision = plan_repair(diagnosis, facts.node.history, fleet.partition, facts.node.node_id,
                           now, config)
    kind = PER_NODE[decision.kind]
    failure = FailureRecord(now, diagnosis.failure_mode, decision.action) \
        if kind in RECORDED else None
    return RepairStep(kind, decision.reason, decision.action, failure, rack_held)


def _by_node(facts: RepairFacts) -> RepairStep | None:
    node, mode = facts.node, facts.diagnosis.failure_mode
    if node.state not in ACTIONABLE:
        return RepairStep(StepKind.NONE, f"{node.state.value}: the decision was taken")
    if mode == OPERATOR_DRAIN_MODE:
        if node.operator_drain is None:
            return RepairStep(StepKind.NONE, "the operator's drain was lifted")
        return RepairStep(StepKind.OPERATOR_DRAIN, node.operator_drain)
    if node.state is NodeState.VERIFYING and node.repair_action is RepairAction.MANUAL:
        return RepairStep(StepKind.FAIL,
                          f"failed its checks after an operator returned it: {mode}")
    return None
