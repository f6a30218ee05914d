"""Versioned event types and their registry.

Every event is a frozen dataclass with a ``TYPE`` string ``mtc.<entity>.<past-tense>.v1``.
``from_dict`` ignores unknown fields and raises ValidationError (a permanent error: the
event is dead-lettered) for missing or ill-typed required ones. A breaking change is a new
``.v2`` class registered beside the old one.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from shared.domain.errors import ValidationError


@dataclass(frozen=True)
class Event:
    TYPE: ClassVar[str] = ""
    SUBJECT_FIELD: ClassVar[str] = ""

    @property
    def subject(self) -> str:
        return str(getattr(self, self.SUBJECT_FIELD)) if self.SUBJECT_FIELD else ""

    @property
    def family(self) -> str:
        """The entity part of the type: one Pub/Sub topic per family."""
        return self.TYPE.split(".")[1]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls: type[E], data: Mapping[str, Any]) -> E:
        if not isinstance(data, Mapping):
            raise ValidationError("data", f"must be an object, got {type(data).__name__}")
        kwargs: dict[str, Any] = {}
        for name, (kind, required) in _field_kinds(cls).items():  # type: ignore[arg-type]
            if name not in data or data[name] is None:
                if required:
                    raise ValidationError(f"data.{name}", "is required")
                continue
            kwargs[name] = _coerce(data[name], kind, f"data.{name}")
        return cls(**kwargs)


E = TypeVar("E", bound=Event)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@functools.cache
def _field_kinds(cls: type[Event]) -> dict[str, tuple[Any, bool]]:
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Any, bool]] = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = (hints[f.name], required)
    return out


def _coerce(value: Any, kind: Any, path: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return _coerce(value, options[0], path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValidationError(path, f"must be a list, got {type(value).__name__}")
        inner = typing.get_args(kind)[0]
        return tuple(_coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict or kind is dict:
        if not isinstance(value, Mapping):
            raise ValidationError(path, f"must be an object, got {type(value).__name__}")
        return dict(value)
    if kind is Any:
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(path, f"must be a number, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(path, f"must be an integer, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ValidationError(path, f"must be a boolean, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ValidationError(path, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported event field type {kind!r} at {path}")


REGISTRY: dict[str, type[Event]] = {}


def register(cls: type[E]) -> type[E]:
    if not cls.TYPE or cls.TYPE in REGISTRY:
        raise ValueError(f"event type {cls.TYPE!r} is empty or registered twice")
    REGISTRY[cls.TYPE] = cls
    return cls


def event_class(type_: str) -> type[Event]:
    try:
        return REGISTRY[type_]
    except KeyError:
        raise ValidationError("type", f"unknown event type {type_!r}") from None


# ---------------------------------------------------------------- clusters


@register
@dataclass(frozen=True)
class ClusterCreateRequested(Event):
    TYPE: ClassVar[str] = "mtc.cluster.create_requested.v1"
    SUBJECT_FIELD: ClassVar[str] = "cluster_id"
    cluster_id: str
    generation: int


@register
@dataclass(frozen=True)
class ClusterUpdateRequested(Event):
    TYPE: ClassVar[str] = "mtc.cluster.update_requested.v1"
    SUBJECT_FIELD: ClassVar[str] = "cluster_id"
    cluster_id: str
    generation: int


@register
@dataclass(frozen=True)
class ClusterDeleteRequested(Event):
    TYPE: ClassVar[str] = "mtc.cluster.delete_requested.v1"
    SUBJECT_FIELD: ClassVar[str] = "cluster_id"
    cluster_id: str


@register
@dataclass(frozen=True)
class ClusterReady(Event):
    TYPE: ClassVar[str] = "mtc.cluster.ready.v1"
    SUBJECT_FIELD: ClassVar[str] = "cluster_id"
    cluster_id: str
    generation: int


@register
@dataclass(frozen=True)
class ClusterDeleted(Event):
    TYPE: ClassVar[str] = "mtc.cluster.deleted.v1"
    SUBJECT_FIELD: ClassVar[str] = "cluster_id"
    cluster_id: str


# ---------------------------------------------------------------- nodes


@register
@dataclass(frozen=True)
class NodeProvisioned(Event):
    """Compute says a node it was asked for is up (or could not be had)."""

    TYPE: ClassVar[str] = "mtc.node.provisioned.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    ok: bool = True
    detail: str = ""


@register
@dataclass(frozen=True)
class NodeHealthReported(Event):
    TYPE: ClassVar[str] = "mtc.node.health_reported.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    observed_at: float
    conditions: tuple[dict[str, Any], ...]
    source: str = "agent"


@register
@dataclass(frozen=True)
class NodeDiagnosed(Event):
    TYPE: ClassVar[str] = "mtc.node.diagnosed.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    observed_at: float
    failure_mode: str
    severity: str
    action: str
    reasons: tuple[str, ...] = ()
    unmapped_xids: tuple[int, ...] = ()


@register
@dataclass(frozen=True)
class NodeDraining(Event):
    """The node takes no new work; its job must checkpoint and leave."""

    TYPE: ClassVar[str] = "mtc.node.draining.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    job_id: str
    reason: str


@register
@dataclass(frozen=True)
class NodeDrained(Event):
    TYPE: ClassVar[str] = "mtc.node.drained.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    reason: str = ""


@register
@dataclass(frozen=True)
class NodeRepairStarted(Event):
    TYPE: ClassVar[str] = "mtc.node.repair_started.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    action: str
    attempt: int
    reason: str = ""


@register
@dataclass(frozen=True)
class NodeRepairHeld(Event):
    """The blast-radius guard refused to take the node out: an alert for a person."""

    TYPE: ClassVar[str] = "mtc.node.repair_held.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    action: str
    reason: str


@register
@dataclass(frozen=True)
class NodeRepairCompleted(Event):
    TYPE: ClassVar[str] = "mtc.node.repair_completed.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    action: str
    attempt: int
    ok: bool
    detail: str = ""


@register
@dataclass(frozen=True)
class NodeReturnedToService(Event):
    TYPE: ClassVar[str] = "mtc.node.returned_to_service.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    cluster_id: str


@register
@dataclass(frozen=True)
class NodeRetired(Event):
    TYPE: ClassVar[str] = "mtc.node.retired.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    reason: str = ""
    replacement_id: str = ""


@register
@dataclass(frozen=True)
class NodeOperatorActed(Event):
    """A person's decision on a node (release a hold, drain, resume, return a failed node):
    who, what, why, when; the audit record the timeline keeps."""

    TYPE: ClassVar[str] = "mtc.node.operator_acted.v1"
    SUBJECT_FIELD: ClassVar[str] = "node_id"
    node_id: str
    cluster_id: str
    action: str
    reason: str
    by: str
    at: float


# ---------------------------------------------------------------- jobs


@register
@dataclass(frozen=True)
class JobSubmitted(Event):
    TYPE: ClassVar[str] = "mtc.job.submitted.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    cluster_id: str


@register
@dataclass(frozen=True)
class JobStarted(Event):
    TYPE: ClassVar[str] = "mtc.job.started.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    node_ids: tuple[str, ...]
    resume_step: int = -1  # newest checkpoint the attempt resumes from; -1: from scratch


@register
@dataclass(frozen=True)
class JobInterruptRequested(Event):
    """Tell the job's workers to checkpoint and stop (SIGTERM with a grace period)."""

    TYPE: ClassVar[str] = "mtc.job.interrupt_requested.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    node_id: str
    reason: str


@register
@dataclass(frozen=True)
class JobSignalled(Event):
    """Workers were sent SIGTERM: they have grace_s to checkpoint before SIGKILL."""

    TYPE: ClassVar[str] = "mtc.job.signalled.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    grace_s: float
    reason: str


@register
@dataclass(frozen=True)
class JobCheckpointSaved(Event):
    TYPE: ClassVar[str] = "mtc.job.checkpoint_saved.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    step: int
    path: str
    saved_at: float


@register
@dataclass(frozen=True)
class JobFirstStep(Event):
    """The first training step of an attempt has run: everything before it (launch,
    checkpoint restore, a slow first step) was startup. ``step`` is that step's number."""

    TYPE: ClassVar[str] = "mtc.job.first_step.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    step: int


@register
@dataclass(frozen=True)
class JobWorkersExited(Event):
    """All workers of one attempt have exited; exit_code is the worst (first non-zero)."""

    TYPE: ClassVar[str] = "mtc.job.workers_exited.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    exit_code: int
    detail: str = ""


@register
@dataclass(frozen=True)
class JobRequeued(Event):
    TYPE: ClassVar[str] = "mtc.job.requeued.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    cluster_id: str
    restart_count: int
    reason: str = ""


@register
@dataclass(frozen=True)
class JobCancelRequested(Event):
    TYPE: ClassVar[str] = "mtc.job.cancel_requested.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str


@register
@dataclass(frozen=True)
class JobFinished(Event):
    TYPE: ClassVar[str] = "mtc.job.finished.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    cluster_id: str
    state: str
    restart_count: int = 0
    detail: str = ""


@register
@dataclass(frozen=True)
class TuningJobEnded(Event):
    """A hyperparameter tuning job (a study) reached SUCCEEDED, FAILED or CANCELLED."""
    TYPE: ClassVar[str] = "mtc.job.tuning_ended.v1"
    SUBJECT_FIELD: ClassVar[str] = "study_id"
    study_id: str
    cluster_id: str
    state: str


# ---------------------------------------------------------------- fleet


@register
@dataclass(frozen=True)
class FleetTicked(Event):
    """A periodic tick (Cloud Scheduler in GCP): heartbeat timeouts, retries of stuck work."""

    TYPE: ClassVar[str] = "mtc.fleet.ticked.v1"
    SUBJECT_FIELD: ClassVar[str] = "cluster_id"
    cluster_id: str
    at: float


# ---------------------------------------------------------------- alerts


@register
@dataclass(frozen=True)
class AlertRaised(Event):
    """An alert for a person, sent once per (kind, subject) and then only on a change, a
    reminder or its resolution (``services.observability.alerts``). Its family is the
    ``mtc-alerts`` Pub/Sub topic; the embedded bus hands it to the webhook sink."""

    TYPE: ClassVar[str] = "mtc.alerts.raised.v1"
    SUBJECT_FIELD: ClassVar[str] = "target"
    kind: str
    target: str  # what it is about: a node id, a job id, "all", "controller"
    state: str  # firing | resolved
    severity: str
    summary: str
    first_at: float
    sent: int = 1  # the how-many-th notification of this alert (reminders, changes)
    cluster_id: str = ""
    node_id: str = ""
    job_id: str = ""


@dataclass(frozen=True)
class Envelope:
    """An event with its CloudEvent attributes: what buses carry and outboxes hold."""

    event: Event
    id: str
    source: str
    time: float
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The idempotency key: CloudEvent source + id."""
        return f"{self.source}#{self.id}"

    @property
    def type(self) -> str:
        return self.event.TYPE
