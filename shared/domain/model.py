"""Entities and their state machines: clusters, partitions, nodes, jobs.

Entities are plain mutable objects owned by a unit of work; every state change goes through
``transition`` so an edge the table does not list raises instead of overwriting.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NamedTuple

from shared.domain.health import NON_FATAL_CONDITIONS, ConditionStatus, FailureRecord, RepairAction
from shared.domain.partition import Partition as Partition  # re-exported: callers keep one import
from shared.domain.partition import partition_key as partition_key
from shared.domain.recovery import JobRecovery
from shared.domain.spec_cache import cluster_specs as _cluster_spec
from shared.domain.spec_cache import job_specs as _job_spec
from shared.domain.specs import ClusterSpec, CustomJobSpec
from shared.domain.statemachine import TransitionTable


def _fs(*states: Any) -> frozenset[Any]:
    return frozenset(states)


# ---------------------------------------------------------------- clusters


class ClusterState(enum.StrEnum):
    PROVISIONING = "PROVISIONING"
    READY = "READY"
    UPDATING = "UPDATING"
    DELETING = "DELETING"
    DELETED = "DELETED"
    FAILED = "FAILED"


_CLUSTER_STATES = dict(ClusterState._value2member_map_)  # value -> member, no Enum call


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "spec": _cluster_spec.doc(self.cluster_id, self.spec),
            "state": self.state.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "generation": self.generation,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        return cls(
            cluster_id=d["cluster_id"],
            spec=_cluster_spec(d["cluster_id"], d["spec"]),
            state=_CLUSTER_STATES.get(d["state"]) or ClusterState(d["state"]),
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

    Immutable, so a node's document and its entity share them: decoding a node copies one
    dict of twelve of these instead of building twelve objects, and a commit that left them
    alone compares them by identity (a node is decoded and encoded several times per event).
    A change replaces the condition (``_replace``)."""

    status: str
    reason: str
    since: float
    last_seen: float


class ConditionMap(dict[str, NodeCondition]):
    """A node document's conditions as :meth:`Node.to_dict` writes them (values already
    :class:`NodeCondition`); a store that round-trips through JSON gives back a plain dict
    of lists, which :func:`_conditions` rebuilds."""


def _conditions(raw: Any) -> dict[str, NodeCondition]:
    if type(raw) is ConditionMap:
        return dict(raw)
    return {t: NodeCondition(*c) for t, c in (raw or {}).items()}


class NodeRole(enum.StrEnum):
    LOGIN = "login"
    WORKER = "worker"


# value -> member without Enum.__call__ (a node document is decoded millions of times a run)
_NODE_STATES, _NODE_ROLES = dict(NodeState._value2member_map_), dict(NodeRole._value2member_map_)
_ACTIONS = dict(RepairAction._value2member_map_)


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
        # the fields as they are (plain values, or immutable: the conditions are shared), then
        # the few that are stored in another form (a node is encoded several times an event)
        doc = dict(self.__dict__)
        doc["role"] = self.role._value_
        doc["state"] = self.state._value_
        action = self.repair_action
        doc["repair_action"] = action._value_ if action else None
        doc["history"] = [[r.at, r.failure_mode, r.action._value_] for r in self.history]
        doc["conditions"] = ConditionMap(self.conditions)
        sound = self.sound
        doc["sound"] = sound  # derived, for the store's indexes (ignored by from_dict)
        # the job it is allocated to and sound under, else None: a restart reads one index
        # bucket for which of its 2,048 nodes are sound (shared.job_nodes)
        doc["sound_for"] = _sound_for(self, sound)
        return doc

    def doc_value(self, name: str) -> Any:
        """``to_dict()[name]`` (None for a field it lacks) without encoding the rest: a
        query within a unit of work checks the nodes it holds field by field (a cluster's
        creation holds 2,081)."""
        encode = _NODE_ENCODINGS.get(name)
        return encode(self) if encode is not None else self.__dict__.get(name)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Node:
        node = _new(cls)
        state = node.__dict__
        if d.keys() == _NODE_ENCODED:  # what to_dict writes: the fields, then the derived two
            state.update(d)  # (one copy: a node is decoded several times per event)
            del state["sound"], state["sound_for"]
        else:  # an older or a partial document: over the defaults
            state.update(_NODE_DEFAULTS)
            state.update(d)
            state.pop("sound", None)
            state.pop("sound_for", None)
            if state.keys() != _NODE_FIELDS:
                return cls._from_partial(d)  # a required field missing, or one we do not know
        state["role"] = _NODE_ROLES[state["role"]]
        state["state"] = _NODE_STATES[state["state"]]
        action = state["repair_action"]
        state["repair_action"] = _ACTIONS[action] if action else None
        history = state["history"]
        state["history"] = [FailureRecord(h[0], h[1], _ACTIONS[h[2]]) for h in history] \
            if history else []
        state["conditions"] = _conditions(state["conditions"])
        return node

    @classmethod
    def _from_partial(cls, d: dict[str, Any]) -> Node:
        """A document that is not exactly a node's fields: required ones read by name (a
        missing one raises KeyError), unknown ones ignored."""
        known = {k: v for k, v in d.items() if k in _NODE_FIELDS}
        for name in _NODE_REQUIRED:
            known[name] = d[name]
        return cls.from_dict(known)


def _sound_for(node: Node, sound: bool) -> str | None:
    """The document's ``sound_for``: the job the node is allocated to and sound under."""
    return node.job_id if sound and node.state is NodeState.ALLOCATED else None


# the document fields Node.to_dict writes in another form than the attribute's own
_NODE_ENCODINGS: dict[str, Callable[[Node], Any]] = {
    "role": lambda n: n.role._value_,
    "state": lambda n: n.state._value_,
    "repair_action": lambda n: n.repair_action._value_ if n.repair_action else None,
    "sound": lambda n: n.sound,
    "sound_for": lambda n: _sound_for(n, n.sound),
    "history": lambda n: n.to_dict()["history"],
    "conditions": lambda n: n.to_dict()["conditions"],
}
_new = object.__new__
_NODE_FIELDS = frozenset(f.name for f in fields(Node))
_NODE_ENCODED = _NODE_FIELDS | {"sound", "sound_for"}  # the keys of Node.to_dict's document
# what an older document lacks: the field's default (history and conditions: empty, rebuilt;
# a node without accelerators may omit them)
_NODE_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Node)
                                  if f.default is not MISSING}
_NODE_DEFAULTS.update(history=None, conditions=None, accelerator_type=None, accelerator_count=0)
_NODE_REQUIRED = tuple(sorted(_NODE_FIELDS - _NODE_DEFAULTS.keys()))


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


_JOB_STATES = dict(JobState._value2member_map_)  # value -> member, no Enum call


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


class Checkpoint(NamedTuple):
    """A saved checkpoint. Immutable, so the job document and the entity share them (a job
    keeps its last 20 and is read several times per event of its own)."""

    step: int
    path: str
    at: float
    attempt: int
    save_s: float = 0.0  # how long its save blocked training, as measured (0: not measured)


class CheckpointList(list[Checkpoint]):
    """A job document's checkpoints as :meth:`Job.to_dict` writes them (already
    :class:`Checkpoint`); a store that round-trips through JSON gives back lists."""


def _checkpoints(raw: Any) -> list[Checkpoint]:
    if type(raw) is CheckpointList:
        return list(raw)
    return [Checkpoint(*c[:5]) for c in raw or ()]


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
    # a node per rank ('' for a lost rank's hole); tuples, shared with the job's document (a
    # 2,048-rank job is read and written several times per restart: no copy, and an
    # unchanged one compares by identity at commit). A change assigns a new tuple.
    node_ids: tuple[str, ...] = ()
    previous_node_ids: tuple[str, ...] = ()
    checkpoints: list[Checkpoint] = field(default_factory=list)
    interrupt_reason: str = ""
    interrupt_requested_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: str = ""
    recovery: JobRecovery = field(default_factory=JobRecovery)  # backoff, suspects, progress
    # the checkpoint interval its history calls for (checkpoint_resume; CheckpointAdvice)
    checkpoint_advice: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if type(self.node_ids) is not tuple:  # a list from a caller: our own immutable copy
            self.node_ids = tuple(self.node_ids)
        if type(self.previous_node_ids) is not tuple:
            self.previous_node_ids = tuple(self.previous_node_ids)

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "cluster_id": self.cluster_id,
            "spec": _job_spec.doc(self.job_id, self.spec),
            "state": self.state.value,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "priority": self.priority,
            "attempt": self.attempt,
            "restart_count": self.restart_count,
            "node_ids": tuple(self.node_ids),
            "previous_node_ids": tuple(self.previous_node_ids),
            "checkpoints": CheckpointList(self.checkpoints),
            "interrupt_reason": self.interrupt_reason,
            "interrupt_requested_at": self.interrupt_requested_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "error": self.error,
            "recovery": self.recovery.to_dict(),
            "checkpoint_advice": self.checkpoint_advice,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        return cls(
            job_id=d["job_id"],
            cluster_id=d["cluster_id"],
            spec=_job_spec(d["job_id"], d["spec"]),
            state=_JOB_STATES.get(d["state"]) or JobState(d["state"]),
            created_at=d["created_at"],
            updated_at=d["updated_at"],
            priority=d.get("priority", 0),
            attempt=d.get("attempt", 0),
            restart_count=d.get("restart_count", 0),
            node_ids=tuple(d.get("node_ids", ())),
            previous_node_ids=tuple(d.get("previous_node_ids", ())),
            checkpoints=_checkpoints(d.get("checkpoints")),
            interrupt_reason=d.get("interrupt_reason", ""),
            interrupt_requested_at=d.get("interrupt_requested_at"),
            started_at=d.get("started_at"),
            ended_at=d.get("ended_at"),
            error=d.get("error", ""),
            recovery=JobRecovery.from_dict(d.get("recovery")),
            checkpoint_advice=d.get("checkpoint_advice"),
        )
