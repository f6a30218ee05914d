"""Entities and their state machines: clusters, partitions, nodes, jobs.

Entities are plain mutable objects owned by a unit of work; every state change goes through
``transition`` so an edge the table does not list raises instead of overwriting.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NamedTuple, TypeVar

from shared.domain.health import NON_FATAL_CONDITIONS, ConditionStatus, FailureRecord, RepairAction
from shared.domain.partition import Partition as Partition  # re-exported: callers keep one import
from shared.domain.partition import partition_key as partition_key
from shared.domain.ranks import Ranks, as_ranks
from shared.domain.recovery import JobRecovery
from shared.domain.specs import ClusterSpec, CustomJobSpec
from shared.domain.statemachine import TransitionTable


def _fs(*states: Any) -> frozenset[Any]:
    return frozenset(states)


S = TypeVar("S")
SpecDoc = Callable[[str, S], dict[str, Any]]  # (entity id, spec) -> the spec's document
SpecParse = Callable[[str, Mapping[str, Any]], S]  # (entity id, document) -> its spec


# ---------------------------------------------------------------- clusters


class ClusterState(enum.StrEnum):
    PROVISIONING = "PROVISIONING"
    READY = "READY"
    UPDATING = "UPDATING"
    DELETING = "DELETING"
    DELETED = "DELETED"
    FAILED = "FAILED"


CS = ClusterState
CLUSTER_TRANSITIONS: TransitionTable[ClusterState] = TransitionTable(
    "cluster",
    {
        CS.PROVISIONING: _fs(CS.READY, CS.FAILED, CS.DELETING),
        CS.READY: _fs(CS.UPDATING, CS.DELETING),
        CS.UPDATING: _fs(CS.READY, CS.FAILED, CS.DELETING),
        CS.DELETING: _fs(CS.DELETED),
        CS.DELETED: _fs(),
        CS.FAILED: _fs(CS.DELETING, CS.UPDATING),
    },
)


@dataclass
class Cluster:
    cluster_id: str
    spec: ClusterSpec
    state: ClusterState
    created_at: float
    updated_at: float
    generation: int = 1  # bumped by every accepted update; steps of older generations are stale
    message: str = ""

    def transition(self, target: ClusterState, now: float, message: str = "") -> None:
        CLUSTER_TRANSITIONS.check(self.cluster_id, self.state, target)
        self.state = target
        self.updated_at = now
        self.message = message

    def to_dict(self, spec_doc: SpecDoc[ClusterSpec] | None = None) -> dict[str, Any]:
        """``spec_doc``: (cluster id, spec) -> the spec's document (a mapper's cache), else
        the spec's own ``to_dict``."""
        return {
            "cluster_id": self.cluster_id,
            "spec": spec_doc(self.cluster_id, self.spec) if spec_doc else self.spec.to_dict(),
            "state": self.state.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "generation": self.generation,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], parse_spec: SpecParse[ClusterSpec] | None = None
                  ) -> Cluster:
        """``parse_spec``: (cluster id, document) -> its spec (a mapper's cache), else
        ``ClusterSpec.from_dict``."""
        spec = d["spec"]
        return cls(
            cluster_id=d["cluster_id"],
            spec=parse_spec(d["cluster_id"], spec) if parse_spec else ClusterSpec.from_dict(spec),
            state=ClusterState(d["state"]),
            created_at=d["created_at"],
            updated_at=d["updated_at"],
            generation=d.get("generation", 1),
            message=d.get("message", ""),
        )


# ---------------------------------------------------------------- partitions


# ---------------------------------------------------------------- nodes


class NodeState(enum.StrEnum):
    PROVISIONING = "provisioning"
    IDLE = "idle"
    ALLOCATED = "allocated"
    SUSPECT = "suspect"  # sick but held in service by the blast-radius guard
    DRAINING = "draining"  # no new work; waiting for its job to checkpoint and leave
    DRAINED = "drained"
    REPAIRING = "repairing"  # Node.repair_action says which rung is under way
    VERIFYING = "verifying"  # repaired; must pass its checks again before it returns
    FAILED = "failed"  # repair ladder exhausted or manual action needed
    RETIRED = "retired"  # gone for good (replaced or deleted)


NS = NodeState
NODE_TRANSITIONS: TransitionTable[NodeState] = TransitionTable(
    "node",
    {
        NS.PROVISIONING: _fs(NS.VERIFYING, NS.IDLE, NS.FAILED, NS.RETIRED),
        NS.IDLE: _fs(NS.ALLOCATED, NS.SUSPECT, NS.DRAINED, NS.RETIRED),
        NS.ALLOCATED: _fs(NS.IDLE, NS.SUSPECT, NS.DRAINING),
        NS.SUSPECT: _fs(NS.IDLE, NS.ALLOCATED, NS.DRAINING, NS.DRAINED, NS.RETIRED),
        NS.DRAINING: _fs(NS.DRAINED),
        # (an operator's resume: IDLE, or VERIFYING when it had faults)
        NS.DRAINED: _fs(NS.REPAIRING, NS.FAILED, NS.RETIRED, NS.IDLE, NS.VERIFYING),
        NS.REPAIRING: _fs(NS.VERIFYING, NS.REPAIRING, NS.FAILED, NS.RETIRED),
        NS.VERIFYING: _fs(NS.IDLE, NS.DRAINED, NS.FAILED, NS.RETIRED),
        NS.FAILED: _fs(NS.REPAIRING, NS.RETIRED, NS.VERIFYING),  # (returned by an operator)
        NS.RETIRED: _fs(),
    },
)

IN_SERVICE = frozenset({NS.IDLE, NS.ALLOCATED, NS.SUSPECT})
SCHEDULABLE = frozenset({NS.IDLE})
TAKES_WORK = frozenset({NS.IDLE, NS.ALLOCATED})  # may keep new work: idle, or its pending job's
_TRUE = ConditionStatus.TRUE.value


class NodeCondition(NamedTuple):
    """A node's current state of one condition type: status and reason as last reported,
    ``since`` when the status last changed, ``last_seen`` the newest report that carried it.

    Immutable, so a node's document and its entity may share them. A change replaces the
    condition (``_replace``)."""

    status: str
    reason: str
    since: float
    last_seen: float


def conditions_from(raw: Mapping[str, Any] | None) -> dict[str, NodeCondition]:
    """A document's conditions: each a :class:`NodeCondition` already, or its list."""
    return {t: c if type(c) is NodeCondition else NodeCondition(*c)
            for t, c in (raw or {}).items()}


class NodeRole(enum.StrEnum):
    LOGIN = "login"
    WORKER = "worker"


@dataclass
class Node:
    node_id: str
    cluster_id: str
    pool: str
    partition: str
    role: NodeRole
    machine_type: str
    accelerator_type: str | None
    accelerator_count: int
    state: NodeState
    since: float
    is_spare: bool = False
    reason: str = ""
    job_id: str | None = None
    repair_action: RepairAction | None = None
    repair_attempt: int = 0  # increases with every repair started: the compute idempotency key
    history: list[FailureRecord] = field(default_factory=list)
    passes: int = 0  # consecutive healthy checks while VERIFYING (hysteresis)
    first_pass_at: float | None = None
    last_report_at: float | None = None  # the last heartbeat: any report from its agent
    last_diagnosis: str = ""
    last_action: str = ""  # the action of the last diagnosis emitted
    diagnosed_at: float | None = None  # when that diagnosis was emitted
    conditions: dict[str, NodeCondition] = field(default_factory=dict)
    alert: str = ""  # the alert last raised for this node (held repair, needs a person)
    alerted_at: float | None = None
    replaces: str | None = None  # the node this one replaced
    retire_when_drained: bool = False  # scale-down: leave for good instead of being repaired
    generation: int = 1  # cluster generation that created the node
    # when its present life began (provisioning requested, or its last repair started): a
    # report observed before then describes the node it was, and is stale
    renewed_at: float | None = None
    fault: str = ""  # the active fault whose diagnosis takes the node out ("" when healthy)
    operator_request: str = ""  # the last operator command applied ("verb:reason")
    # a repair's result that came before the commit that started that repair (compute answers
    # from outside the asking transaction): [attempt, action, ok, detail], announced again by
    # that start when it commits (repair service)
    early_repair: tuple[int, str, bool, str] | None = None
    # where it sits (shared.domain.topology; "" = no topology): racks fail as a unit
    rack: str = ""
    nvlink_domain: str = ""
    switch: str = ""
    # its software (nodeImage, driver, agent: shared.policies.rollout), as its last reimage
    # wrote it ({}: as first provisioned); ``software_target`` is what its next reimage
    # writes (a rollout's staged version). Replaced, never changed in place: the document
    # shares the value.
    software: dict[str, str] = field(default_factory=dict)
    software_target: dict[str, str] | None = None

    def transition(self, target: NodeState, now: float, reason: str = "") -> None:
        if target is self.state and target is not NodeState.REPAIRING:
            return  # desired state already reached: applying it again is a no-op
        NODE_TRANSITIONS.check(self.node_id, self.state, target)
        self.state = target
        self.since = now
        self.reason = reason
        if target is not NodeState.VERIFYING:
            self.passes = 0
            self.first_pass_at = None
        if target in (NodeState.IDLE, NodeState.ALLOCATED, NodeState.RETIRED):
            self.repair_action = None

    @property
    def in_service(self) -> bool:
        return self.state in IN_SERVICE

    @property
    def sound(self) -> bool:
        """Takes work, no fault, no condition that ends a job; stored and indexed (restarts)."""
        if self.state not in TAKES_WORK or self.fault:
            return False
        for ctype, cond in self.conditions.items():  # (a loop: every encoding asks, 12 each)
            if cond[0] == _TRUE and ctype not in NON_FATAL_CONDITIONS:
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["role"] = self.role.value
        doc["state"] = self.state.value
        doc["repair_action"] = self.repair_action.value if self.repair_action else None
        doc["history"] = [[r.at, r.failure_mode, r.action.value] for r in self.history]
        doc["conditions"] = dict(self.conditions)
        doc["sound"] = self.sound  # derived, for the store's indexes (ignored by from_dict)
        # the job it is allocated to and sound under, else None: a restart reads one index
        # bucket for which of its 2,048 nodes are sound (shared.service_layer.job_nodes)
        doc["sound_for"] = sound_for(self)
        return doc

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Node:
        """A node's document; unknown fields are ignored, the derived ones too, a missing
        required one raises KeyError, a missing optional one gets its default."""
        known = {k: v for k, v in d.items() if k in NODE_FIELDS}
        for name in NODE_REQUIRED:
            known[name] = d[name]
        known["role"] = NodeRole(known["role"])
        known["state"] = NodeState(known["state"])
        action = known.get("repair_action")
        known["repair_action"] = RepairAction(action) if action else None
        known["history"] = [FailureRecord(h[0], h[1], RepairAction(h[2]))
                            for h in known.get("history") or ()]
        known["conditions"] = conditions_from(known.get("conditions"))
        known.setdefault("accelerator_type", None)
        known.setdefault("accelerator_count", 0)
        return cls(**known)


def sound_for(node: Node) -> str | None:
    """The document's ``sound_for``: the job the node is allocated to and sound under."""
    return node.job_id if node.state is NodeState.ALLOCATED and node.sound else None


NODE_FIELDS = frozenset(f.name for f in fields(Node))
# (a node without accelerators may omit them)
NODE_REQUIRED = tuple(sorted(
    {f.name for f in fields(Node) if f.default is MISSING and f.default_factory is MISSING}
    - {"accelerator_type", "accelerator_count"}))


# ---------------------------------------------------------------- jobs



class JobState(enum.StrEnum):
    """The states users know from managed training (JOB_STATE_*)."""

    QUEUED = "JOB_STATE_QUEUED"
    PENDING = "JOB_STATE_PENDING"
    RUNNING = "JOB_STATE_RUNNING"
    SUCCEEDED = "JOB_STATE_SUCCEEDED"
    FAILED = "JOB_STATE_FAILED"
    CANCELLING = "JOB_STATE_CANCELLING"
    CANCELLED = "JOB_STATE_CANCELLED"


JS = JobState
JOB_TRANSITIONS: TransitionTable[JobState] = TransitionTable(
    "job",
    {
        JS.QUEUED: _fs(JS.PENDING, JS.CANCELLED, JS.FAILED),
        JS.PENDING: _fs(JS.RUNNING, JS.CANCELLED, JS.FAILED),
        JS.RUNNING: _fs(JS.PENDING, JS.SUCCEEDED, JS.FAILED, JS.CANCELLING),
        JS.SUCCEEDED: _fs(),
        JS.FAILED: _fs(),
        JS.CANCELLING: _fs(JS.CANCELLED),
        JS.CANCELLED: _fs(),
    },
)
TERMINAL_JOB_STATES = frozenset({JS.SUCCEEDED, JS.FAILED, JS.CANCELLED})
NO_RANKS = Ranks()  # (immutable: one shared by every job not placed)


class Checkpoint(NamedTuple):
    """A saved checkpoint. Immutable, so the job document and the entity may share them."""

    step: int
    path: str
    at: float
    attempt: int
    save_s: float = 0.0  # how long its save blocked training, as measured (0: not measured)


def checkpoints_from(raw: Any) -> list[Checkpoint]:
    """A document's checkpoints: each a :class:`Checkpoint` already, or its list (an older
    one without ``save_s``)."""
    return [c if type(c) is Checkpoint else Checkpoint(*c[:5]) for c in raw or ()]


@dataclass
class Job:
    job_id: str
    cluster_id: str
    spec: CustomJobSpec
    state: JobState
    created_at: float
    updated_at: float
    priority: int = 0
    attempt: int = 0  # increases with every start: worker events of older attempts are stale
    restart_count: int = 0
    # a node per rank ('' for a lost rank's hole): immutable values that know their holes,
    # shared with the job's document. A change assigns a new value.
    node_ids: Ranks = NO_RANKS
    previous_node_ids: Ranks = NO_RANKS
    checkpoints: list[Checkpoint] = field(default_factory=list)
    interrupt_reason: str = ""
    interrupt_requested_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: str = ""
    recovery: JobRecovery = field(default_factory=JobRecovery)  # backoff, suspects, progress
    # the checkpoint interval its history calls for (checkpoint_resume; CheckpointAdvice)
    checkpoint_advice: dict[str, Any] | None = None
    # while it waits on a cluster with team queues: team, partition, position, reason
    queue: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.node_ids = as_ranks(self.node_ids)  # (a tuple or list from a caller)
        self.previous_node_ids = as_ranks(self.previous_node_ids)

    def transition(self, target: JobState, now: float) -> None:
        JOB_TRANSITIONS.check(self.job_id, self.state, target)
        self.state = target
        self.updated_at = now
        if target in TERMINAL_JOB_STATES:
            self.ended_at = now

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_JOB_STATES

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        return max(self.checkpoints, key=lambda c: c.step, default=None)

    def to_dict(self, spec_doc: SpecDoc[CustomJobSpec] | None = None) -> dict[str, Any]:
        """``spec_doc``: (job id, spec) -> the spec's document (a mapper's cache), else the
        spec's own ``to_dict``."""
        return {
            "job_id": self.job_id,
            "cluster_id": self.cluster_id,
            "spec": spec_doc(self.job_id, self.spec) if spec_doc else self.spec.to_dict(),
            "state": self.state.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "priority": self.priority,
            "attempt": self.attempt,
            "restart_count": self.restart_count,
            "node_ids": self.node_ids,
            "previous_node_ids": self.previous_node_ids,
            "checkpoints": list(self.checkpoints),
            "interrupt_reason": self.interrupt_reason,
            "interrupt_requested_at": self.interrupt_requested_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "error": self.error,
            "recovery": self.recovery.to_dict(),
            "checkpoint_advice": self.checkpoint_advice,
            **({"queue": self.queue} if self.queue else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], parse_spec: SpecParse[CustomJobSpec] | None = None
                  ) -> Job:
        """``parse_spec``: (job id, document) -> its spec (a mapper's cache), else
        ``CustomJobSpec.from_dict``."""
        spec = d["spec"]
        return cls(
            job_id=d["job_id"],
            cluster_id=d["cluster_id"],
            spec=parse_spec(d["job_id"], spec) if parse_spec else CustomJobSpec.from_dict(spec),
            state=JobState(d["state"]),
            created_at=d["created_at"],
            updated_at=d["updated_at"],
            priority=d.get("priority", 0),
            attempt=d.get("attempt", 0),
            restart_count=d.get("restart_count", 0),
            node_ids=as_ranks(d.get("node_ids", ())),
            previous_node_ids=as_ranks(d.get("previous_node_ids", ())),
            checkpoints=checkpoints_from(d.get("checkpoints")),
            interrupt_reason=d.get("interrupt_reason", ""),
            interrupt_requested_at=d.get("interrupt_requested_at"),
            started_at=d.get("started_at"),
            ended_at=d.get("ended_at"),
            error=d.get("error", ""),
            recovery=JobRecovery.from_dict(d.get("recovery")),
            checkpoint_advice=d.get("checkpoint_advice"),
            queue=d.get("queue"),
        )
