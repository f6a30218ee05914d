"""Versioned event types and their registry.

Every event is a frozen dataclass with a ``TYPE`` string ``mtc.<entity>.<past-tense>.v1``.
``from_dict`` ignores unknown fields and raises ValidationError (a permanent error: the
event is dead-lettered) for missing or ill-typed required ones. A breaking change is a new
``.v2`` class registered beside the old one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from shared.domain.event_base import REGISTRY as REGISTRY
from shared.domain.event_base import E as E  # re-exported: callers keep one import
from shared.domain.event_base import Event as Event
from shared.domain.event_base import event_class as event_class
from shared.domain.event_base import register as register

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
class DomainDrained(Event):
    """A rack was drained to be repaired as one (``held``: the guard per domain held it);
    emitted once per drain, the alert itself is state (services.observability.alerts)."""

    TYPE: ClassVar[str] = "mtc.domain.drained.v1"
    SUBJECT_FIELD: ClassVar[str] = "domain"
    cluster_id: str
    partition: str
    domain: str
    node_ids: tuple[str, ...]
    reason: str
    held: bool = False


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
    partition: str = ""  # the node's partition ("" when none, or from an older emitter)


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
class JobPreflightChecked(Event):
    """A preflight ran among ``node_ids`` before the job's next attempt
    (``shared.service_layer.preflight``) from ``started_at`` to the event: scheduling badput of
    the job. ``failed_node_ids`` were excluded and the gang placed again; empty: the attempt
    starts on these nodes."""

    TYPE: ClassVar[str] = "mtc.job.preflight_checked.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    node_ids: tuple[str, ...]
    started_at: float
    finished_at: float
    mode: str
    failed_node_ids: tuple[str, ...] = ()
    detail: str = ""


@register
@dataclass(frozen=True)
class JobAdopted(Event):
    """A job mtc did not submit (a user's own ``sbatch`` in a partition mtc manages) is seen
    running on mtc's nodes: attempt ``attempt`` (Slurm's restart count + 1). The first one
    adopts it as a job of origin "slurm"; a later one starts its next attempt, where Slurm,
    not mtc, placed it."""

    TYPE: ClassVar[str] = "mtc.job.adopted.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    node_ids: tuple[str, ...]
    slurm_job_id: int
    name: str = ""
    user: str = ""
    partition: str = ""
    command: str = ""
    checkpoint_dir: str = ""


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
    save_s: float = 0.0  # how long the save blocked training, as measured (0: not measured)
    # where it was saved: "durable" (tier 3, AIP_CHECKPOINT_DIR), "memory" (tier 1, the
    # node's tmpfs) or "peer" (tier 2, a copy on the buddy's node); mtc_program.protocol
    tier: str = "durable"


@register
@dataclass(frozen=True)
class JobFirstStep(Event):
    """The first training step of an attempt has run: everything before it (launch,
    checkpoint restore, a slow first step) was startup. ``step`` is that step's number;
    ``at`` when it ended, by the program's own record (None: when it was reported)."""

    TYPE: ClassVar[str] = "mtc.job.first_step.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    step: int
    at: float | None = None


@register
@dataclass(frozen=True)
class JobWorkersExited(Event):
    """All workers of one attempt have exited; exit_code is the worst (first non-zero).
    ``storage_full``: the evidence that the file system holding the job's files was full
    when a rank exited non-zero (``shared.domain.storage``): its path, "" when not.
    ``launch_failed``: why the platform could not start the rank that ended the attempt
    (``shared.domain.exits``), "" when every rank started or its command was at fault."""

    TYPE: ClassVar[str] = "mtc.job.workers_exited.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    exit_code: int
    detail: str = ""
    storage_full: str = ""
    launch_failed: str = ""


@register
@dataclass(frozen=True)
class JobRestored(Event):
    """The ranks of attempt ``attempt`` restored step ``step`` (-1: none, from scratch),
    by their heartbeats: ``tiers`` the tiers read, nearest first; ``failed`` the entries
    that failed their check (``rank R: TIER step S: why``, a few); ``skipped`` the tiers
    the control plane told them not to read."""

    TYPE: ClassVar[str] = "mtc.job.restored.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    step: int
    tiers: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()


@register
@dataclass(frozen=True)
class JobRecoveryChosen(Event):
    """The recovery policy picked ``mode`` for an incident on attempt ``attempt``
    (``shared.policies.recovery``): ``reason`` says why, with the numbers."""

    TYPE: ClassVar[str] = "mtc.job.recovery_chosen.v1"
    SUBJECT_FIELD: ClassVar[str] = "job_id"
    job_id: str
    attempt: int
    mode: str
    incident: str
    reason: str
    expected_lost_s: float


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


@dataclass(frozen=True, init=False)
class Envelope:
    """An event with its CloudEvent attributes: what buses carry and outboxes hold."""

    event: Event
    id: str
    source: str
    time: float
    attributes: dict[str, str] = field(default_factory=dict)

    def __init__(self, event: Event, id: str, source: str, time: float,
                 attributes: dict[str, str] | None = None) -> None:
        # the fields set at once, not one by one through object.__setattr__ as a frozen
        # dataclass's own __init__ does (one envelope per event: 16,000 a twin run)
        self.__dict__.update(event=event, id=id, source=source, time=time,
                             attributes={} if attributes is None else attributes)

    @property
    def key(self) -> str:
        """The idempotency key: CloudEvent source + id."""
        return f"{self.source}#{self.id}"

    @property
    def type(self) -> str:
        return self.event.TYPE
