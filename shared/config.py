"""Control-plane settings: policy tables and timeouts, one frozen object passed to handlers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shared.policies.checkpointing import CheckpointPolicy
from shared.policies.repair import RepairConfig
from shared.policies.triage import TriageTable, load_triage_table


def _default_table() -> TriageTable:
    return load_triage_table()


@dataclass(frozen=True)
class ControlPlaneConfig:
    triage_table: TriageTable = field(default_factory=_default_table)
    repair: RepairConfig = field(default_factory=RepairConfig)
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    backfill: bool = False
    grace_period_s: float = 30.0  # SIGTERM to SIGKILL: time the job has to checkpoint
    max_event_age_s: float = 3600.0  # older events are dropped: they must not re-drain nodes
    heartbeat_timeout_s: float = 60.0
    output_root: Path = Path("var/jobs")
    python: str = "python3"
    # who drives provisioning: "events" (the handlers, step after step: the embedded default)
    # or "workflow" (Cloud Workflows calls the same steps and owns polling and rollback)
    provisioning: str = "events"
