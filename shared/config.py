"""Control-plane settings: policy tables and timeouts, one frozen object passed to handlers."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from shared.domain.errors import ValidationError
from shared.domain.storage import StorageFloor
from shared.policies.active_checks import ActiveCheckConfig
from shared.policies.checkpointing import CheckpointPolicy
from shared.policies.escalation import LadderConfig
from shared.policies.recovery import RecoveryDefaults
from shared.policies.repair import RepairConfig
from shared.policies.restarts import RestartConfig
from shared.policies.stragglers import StragglerConfig
from shared.policies.triage import TriageTable, load_triage_table


def _default_table() -> TriageTable:
    return load_triage_table()


@dataclass(frozen=True)
class ControlPlaneConfig:
    triage_table: TriageTable = field(default_factory=_default_table)
    repair: RepairConfig = field(default_factory=RepairConfig)
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    # restart backoff and repeat-offender nodes (shared/policies/restarts.py)
    restart: RestartConfig = field(default_factory=RestartConfig)
    # the recovery policy's assumptions until a job measures its own (shared/policies/recovery)
    recovery: RecoveryDefaults = field(default_factory=RecoveryDefaults)
    # restarts without progress climb in place -> hot swap -> requeue -> fail
    # (shared/policies/escalation.py)
    ladder: LadderConfig = field(default_factory=LadderConfig)
    # a straggler is moved off only when its slowdown costs more (shared/policies/stragglers)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    # idle nodes checked actively, on a budget (shared/policies/active_checks.py)
    active_checks: ActiveCheckConfig = field(default_factory=ActiveCheckConfig)
    # progress watchdog (shared/domain/progress.py): a running job silent for longer than
    # max(progress_timeout_s, progress_interval_factor x its longest gap between checkpoints)
    # is interrupted and requeued; 0 turns it off
    progress_timeout_s: float = 1800.0
    progress_interval_factor: float = 3.0
    backfill: bool = False
    # a job's file system with less free than this is full (shared/domain/storage.py): an
    # attempt it ended is interrupted, and the job waits for room before it resumes
    storage_floor: StorageFloor = field(default_factory=StorageFloor)
    grace_period_s: float = 30.0  # SIGTERM to SIGKILL: time the job has to checkpoint
    max_event_age_s: float = 3600.0  # older events are dropped: they must not re-drain nodes
    heartbeat_timeout_s: float = 60.0
    # a held repair or a failed node alerts once, then again only on change or after this
    alert_reminder_s: float = 3600.0
    # retention: the event log keeps this long; idempotency records at least
    # max_event_age_s (a duplicate young enough to be accepted must still be caught)
    retention_s: float = 7 * 24 * 3600.0
    idempotency_retention_s: float = 2 * 3600.0
    prune_interval_s: float = 60.0  # the embedded stores prune at most this often
    output_root: Path = Path("var/jobs")
    python: str = "python3"
    # who drives provisioning: "events" (the handlers, step after step: the embedded default)
    # or "workflow" (Cloud Workflows calls the same steps and owns polling and rollback)
    provisioning: str = "events"

    @functools.cached_property  # (asked per delivery; the settings are frozen)
    def idempotency_window_s(self) -> float:
        """How long an idempotency record is kept: never shorter than the accepted age."""
        return max(self.idempotency_retention_s, self.max_event_age_s)

    def __post_init__(self) -> None:
        for name in ("alert_reminder_s", "retention_s", "idempotency_retention_s",
                     "prune_interval_s", "progress_timeout_s", "progress_interval_factor"):
            if getattr(self, name) < 0:
                raise ValidationError(name, "must not be negative")
