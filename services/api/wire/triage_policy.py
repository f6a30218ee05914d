"""mtc's extension: a cluster's candidate triage table and its rollout (``triagePolicy``).

The candidate is free-form here (a triage table: ``shared/policies/triage_table.py``) and is
validated there, as strictly as the packaged table, each error naming its key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from services.api.wire.proto_json import Message

StageName = Literal["shadow", "recommend", "active"]


class TriageStage(Message):
    """The stage of a cause (a failure mode, ``*``: any) on a partition (``*``: any)."""

    stage: StageName
    cause: str = Field(default="*", min_length=1, max_length=128)
    partition: str = Field(default="*", min_length=1, max_length=128)


class ConfigureTriagePolicyRequest(Message):
    """Set (replace) the cluster's candidate triage table (and its stages) and/or candidate
    repair configuration; a new candidate starts fresh diff reports. The reason goes in the
    audit record."""

    candidate: dict[str, Any] | None = None  # a triage table; or only a repair configuration:
    repair: dict[str, Any] | None = None  # RepairConfig fields, in shadow
    stages: list[TriageStage] = Field(default_factory=list, max_length=256)
    default_stage: StageName = "shadow"
    recommend_timeout_s: float = Field(default=3600.0, ge=1.0, le=7 * 24 * 3600.0)
    timeout_default: Literal["accept", "dismiss"] = "dismiss"
    reason: str = Field(min_length=1, max_length=512)


class DecideRecommendationRequest(Message):
    """An operator's accept or dismiss of one recommendation, and why."""

    # node:cause:action, as GET lists it (no "/": it is part of a document id)
    recommendation: str = Field(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9_.:-]+$")
    reason: str = Field(min_length=1, max_length=512)


class ClearTriagePolicyRequest(Message):
    reason: str = Field(min_length=1, max_length=512)


class TriagePolicy(Message):
    """The rollout (None: no candidate), its diff reports by cause (the triage table's, the
    repair configuration's), its recommendations."""

    policy: dict[str, Any] | None = None
    diff: dict[str, Any] = Field(default_factory=dict)
    repair_diff: dict[str, Any] = Field(default_factory=dict)
    recommendations: list[dict[str, Any]] = Field(default_factory=list)
