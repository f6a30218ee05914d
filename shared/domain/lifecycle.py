"""The node lifecycle rules every service applies, in one place (pure; time is passed in).

Handlers load entities, call these, and emit what the return values say; they no longer
write node states of their own. Ownership of the two halves of the service lifecycle:

- **taking a node out of service** (cordon, drain, repair) belongs to the *repair* service;
- **returning it to service** (hysteresis passed, uncordon, back into its partition) belongs
  to the *health_triage* service, which counts the passing checks that justify it. A held
  (SUSPECT) node that reports healthy again is released by health_triage too.

Conditions are state (node-problem-detector's model): ``observe`` folds a report into the
node's current conditions and says whether anything but "last seen" changed; a report that
changed nothing must not diagnose, alert or appear in the timeline.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.domain.health import (
    OPERATOR_CONDITIONS,
    OPERATOR_SOURCE,
    REMOTE_SOURCES,
    Condition,
    ConditionStatus,
    ConditionType,
    FailureRecord,
    HealthReport,
    RepairAction,
)
from shared.domain.model import (
    IN_SERVICE,
    TAKES_WORK,
    Node,
    NodeCondition,
    NodeState,
    Partition,
)

MAX_HISTORY = 50  # failure records kept per node: enough for every window the ladder reads
# states in which a fresh diagnosis can still change what happens to the node
ACTIONABLE = frozenset({NodeState.IDLE, NodeState.ALLOCATED, NodeState.SUSPECT,
                        NodeState.VERIFYING})
# states whose silence the heartbeat monitor watches
WATCHED = frozenset({NodeState.IDLE, NodeState.ALLOCATED, NodeState.SUSPECT})
HEARTBEAT = ConditionType.HEARTBEAT_LOST.value
# states of a node coming up: a partition counts these unless repair took the node out
COMING_UP = frozenset({NodeState.PROVISIONING, NodeState.VERIFYING})
OPERATOR_DRAIN = ConditionType.DRAINED_BY_OPERATOR.value
OPERATOR_DRAIN_MODE = "drained_by_operator"  # the triage table's failure mode for it


# ---------------------------------------------------------------- history


def record_failure(node: Node, *records: FailureRecord) -> None:
    """Append to the node's failure history, keeping the newest MAX_HISTORY."""
    node.history.extend(records)
    del node.history[:-MAX_HISTORY]


# ---------------------------------------------------------------- conditions


def renew(node: Node, now: float) -> None:
    """The node starts a new life: a repair of it was started (provisioning sets the same
    mark when it creates the record). What was observed before then is history."""
    node.renewed_at = now


def stale_report(node: Node, observed_at: float) -> bool:
    """A report observed before the node's present life began (before its last repair
    started, before it was provisioned), delivered late: a redelivery, an agent resending
    after a lost response. It describes a fault the repair was meant to clear and must not
    act on the node (diagnosed again, it would escalate the repaired node's ladder)."""
    return node.renewed_at is not None and observed_at < node.renewed_at


_TRUE = ConditionStatus.TRUE.value


def observe(node: Node, report: HealthReport) -> bool:
    """Fold ``report`` into ``node.conditions``; True when a condition's status, reason or
    ``since`` changed (or a condition appeared). Every condition seen is stamped last-seen.

    An agent's own report proves the node is alive: a HeartbeatLost the monitor had set is
    cleared even when the report does not carry that condition."""
    changed = False
    at = report.observed_at
    held = node.conditions
    for ctype, cstatus, reason, since, _ in report.conditions:
        prev = held.get(ctype)
        status = cstatus.value
        if prev is None:
            changed = True
            held[ctype] = NodeCondition(status, reason, since, at)
            continue
        held_status, held_reason, held_since, last_seen = prev
        if ctype in OPERATOR_CONDITIONS and report.source != OPERATOR_SOURCE \
                and held_status == _TRUE and status != held_status:
            continue  # an operator's drain is lifted by an operator, never by an agent
        if held_status != status or held_reason != reason or held_since != since:
            changed = True
            held[ctype] = NodeCondition(status, reason, since, at)
        elif at > last_seen:
            held[ctype] = NodeCondition(status, held_reason, held_since, at)
    if report.source not in REMOTE_SOURCES and report.condition(HEARTBEAT) is None:
        lost = node.conditions.get(HEARTBEAT)
        if lost is not None and lost.status == _TRUE:
            node.conditions[HEARTBEAT] = NodeCondition(ConditionStatus.FALSE.value,
                                                       "reporting again", at, at)
            changed = True
    return changed


def heartbeat_lost(node: Node, now: float, timeout_s: float) -> Condition | None:
    """The HeartbeatLost condition the periodic tick raises, once: None while the node is
    heard from, not watched, or already marked lost. Its ``since`` is the moment the silence
    passed the timeout, so raising it again would change nothing."""
    if node.state not in WATCHED:
        return None
    last = node.last_report_at if node.last_report_at is not None else node.since
    if now - last <= timeout_s:
        return None
    current = node.conditions.get(HEARTBEAT)
    if current is not None and current.status == _TRUE:
        return None
    return Condition(HEARTBEAT, ConditionStatus.TRUE, f"no report for over {timeout_s:.0f} s",
                     last + timeout_s, {"silent_for_s": now - last})


def alert_due(node: Node, key: str, now: float, reminder_s: float) -> bool:
    """An alert (a held repair, a failed node) is raised once per ``key``, and again only
    after ``reminder_s``. Marks it raised when due."""
    if node.alert == key and node.alerted_at is not None and now - node.alerted_at < reminder_s:
        return False
    node.alert, node.alerted_at = key, now
    return True


def diagnosis_due(node: Node, failure_mode: str, action: RepairAction, changed: bool,
                  now: float, reminder_s: float) -> bool:
    """Emit a diagnosis when the conditions or the verdict changed, on every report while
    the node is being verified (that is what verification is), or, for a node still held
    with the same fault, once per reminder interval (so repair may re-plan it)."""
    same = (node.last_diagnosis, node.last_action) == (failure_mode, action.value)
    stale = node.diagnosed_at is None or now - node.diagnosed_at >= reminder_s
    if changed or not same or stale or node.state is NodeState.VERIFYING:
        node.last_action, node.diagnosed_at = action.value, now
        return True
    return False


# ---------------------------------------------------------------- service


def hold(node: Node, now: float, reason: str, action: RepairAction | None = None) -> None:
    """The blast-radius guard keeps a sick node in service: mark it SUSPECT, remembering
    the repair it held back (an operator's release runs it)."""
    if node.state in (NodeState.IDLE, NodeState.ALLOCATED):
        node.transition(NodeState.SUSPECT, now, reason)
    if node.state is NodeState.SUSPECT and action is not None:
        node.repair_action = action


def note_fault(node: Node, failure_mode: str, action: RepairAction, healthy: bool) -> None:
    """Remember the active fault that takes the node out (placement avoids it) until a
    report says it is healthy. An operator's drain is not a fault: it is a person's."""
    if healthy:
        node.fault = ""
    elif action.takes_node_out and failure_mode != OPERATOR_DRAIN_MODE:
        node.fault = failure_mode


def operator_drained(node: Node) -> bool:
    """An administrator drained the node (``mtc node drain``, or their own Slurm drain):
    it stays out of service and out of placement, unrepaired, until an operator resumes it."""
    cond = node.conditions.get(OPERATOR_DRAIN)
    return cond is not None and cond.status == _TRUE  # (a constant: asked per report)


def takes_work(node: Node) -> bool:
    """Whether new work may go onto the node (a placement, or a resumed job keeping it):
    idle (or allocated to the pending job), no active fault that takes it out, no held repair
    (a held node is SUSPECT), not drained by an operator."""
    return node.state in TAKES_WORK and not node.fault and not operator_drained(node)


def operator_drain(node: Node, partition: Partition, now: float, text: str,
                   window_s: float) -> bool:
    """A person drains the node: marked DrainedByOperator; a node in service (or being
    verified) leaves its partition's in-service set and waits for its job to checkpoint
    (DRAINING, returns True) or is DRAINED at once. Nothing repairs it meanwhile; a node
    already out (draining, repairing, failed) keeps its course and is parked when it would
    come back. The repair it was due keeps ``repair_action`` (its resume verifies it)."""
    node.conditions[OPERATOR_DRAIN] = NodeCondition(ConditionStatus.TRUE.value, text, now, now)
    if node.state not in IN_SERVICE and node.state is not NodeState.VERIFYING:
        return False
    due = node.repair_action
    draining = take_out_of_service(node, partition, due or RepairAction.NONE, now, text,
                                   window_s)
    node.repair_action = due
    return draining


def park(node: Node, now: float) -> bool:
    """An operator-drained node that would return to service (verified) stays DRAINED."""
    if node.state is not NodeState.VERIFYING:
        return False
    node.transition(NodeState.DRAINED, now, node.conditions[OPERATOR_DRAIN].reason)
    return True


def operator_resume(node: Node, partition: Partition | None, now: float, text: str) -> bool:
    """A person lifts their drain. A parked node with a fault (or a repair it was due) goes
    through verification (hysteresis); one without returns to service now (True: the caller
    uncordons it and emits NodeReturnedToService). A node on another course keeps it."""
    node.conditions[OPERATOR_DRAIN] = NodeCondition(ConditionStatus.FALSE.value, text, now, now)
    if node.state is not NodeState.DRAINED:
        return False
    if node.fault or node.repair_action is not None:
        node.transition(NodeState.VERIFYING, now, f"{text}; verifying")
        reset_passes(node)
        return False
    return_to_service(node, partition, now, text)
    return True


def return_failed(node: Node, now: float, text: str) -> None:
    """A person returns a FAILED node: it must pass the checks a repaired node passes
    (VERIFYING, marked MANUAL so a failed check sends it back to FAILED, not up the
    ladder); what was reported before now describes the node it was."""
    node.transition(NodeState.VERIFYING, now, f"{text}; verifying")
    reset_passes(node)
    node.repair_action = RepairAction.MANUAL
    node.fault = ""
    renew(node, now)


def take_out_of_service(node: Node, partition: Partition, action: RepairAction, now: float,
                        reason: str, window_s: float) -> bool:
    """Repair's half: the node leaves its partition's in-service set and waits for its job
    to checkpoint (DRAINING, returns True) or is drained at once (DRAINED, False). A node
    still coming up was counted in ``settling``; from now on it is listed instead."""
    if node.state in COMING_UP and node.node_id not in partition.out_of_service \
            and partition.settling > 0:
        partition.settling -= 1
    partition.take_out(node.node_id, now, window_s)
    draining = bool(node.job_id) and node.state in (NodeState.ALLOCATED, NodeState.SUSPECT)
    node.transition(NodeState.DRAINING if draining else NodeState.DRAINED, now, reason)
    node.repair_action = action
    return draining


def release_hold(node: Node, now: float) -> bool:
    """A held node reported healthy again: back to what it was doing. True if released."""
    if node.state is not NodeState.SUSPECT:
        return False
    node.transition(NodeState.ALLOCATED if node.job_id else NodeState.IDLE, now,
                    "healthy again")
    return True


def count_pass(node: Node, observed_at: float) -> None:
    """One more consecutive healthy check while VERIFYING (hysteresis)."""
    node.passes += 1
    if node.first_pass_at is None:
        node.first_pass_at = observed_at


def reset_passes(node: Node) -> None:
    node.passes, node.first_pass_at = 0, None


def return_to_service(node: Node, partition: Partition | None, now: float,
                      reason: str = "passed its checks") -> None:
    """health_triage's half: the node passed its checks; IDLE and back in its partition.
    The caller uncordons it in compute and emits NodeReturnedToService."""
    node.transition(NodeState.IDLE, now, reason)
    if partition is not None:
        partition.entered_service(node.node_id)


# ---------------------------------------------------------------- jobs


def assign_to_job(node: Node, job_id: str, now: float) -> None:
    node.transition(NodeState.ALLOCATED, now, f"running {job_id}")
    node.job_id = job_id


def release_from_job(node: Node, job_id: str | None, now: float,
                     reason: str = "job left") -> bool:
    """The node's job is gone (finished, requeued without it, cancelled): an allocated node
    becomes idle, a held one keeps its hold, a draining one is drained. Returns True when
    the node became DRAINED (the caller emits NodeDrained so repair starts). A node that
    belongs to another job (``job_id`` given and different) is left alone."""
    if job_id is not None and node.job_id != job_id:
        return False
    node.job_id = None
    if node.state is NodeState.ALLOCATED:
        node.transition(NodeState.IDLE, now, reason)
    elif node.state is NodeState.SUSPECT:
        node.reason = f"{node.reason} ({reason})"
    elif node.state is NodeState.DRAINING:
        node.transition(NodeState.DRAINED, now, node.reason)
        return True
    return False


def retire(node: Node, now: float, reason: str) -> bool:
    """Gone for good (scale-down, delete, rollback): whatever it was doing ends. Returns
    False when it was already retired (the caller then does nothing)."""
    if node.state is NodeState.RETIRED:
        return False
    if node.state is NodeState.ALLOCATED:  # delete: the job goes with the cluster
        node.job_id = None
        node.transition(NodeState.DRAINING, now, reason)
    if node.state is NodeState.DRAINING:
        node.transition(NodeState.DRAINED, now, reason)
    node.transition(NodeState.RETIRED, now, reason)
    return True


def out_of_service(partitions: Iterable[Partition]) -> set[str]:
    """Node ids the partition aggregates list as out of service (no node scan)."""
    return {n for p in partitions for n in p.out_of_service}


def in_service(node: Node) -> bool:
    return node.state in IN_SERVICE
