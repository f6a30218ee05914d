"""Candidate triage tables for the shadow / recommend / active tests: the packaged table with
one row changed, as the document an operator would send."""

from __future__ import annotations

import copy
from typing import Any

from shared import yaml_text
from shared.policies.triage_table import DEFAULT_TABLE_PATH

CAUSE = "graphics_engine_exception"  # XID 13: the packaged table restarts the job


def packaged() -> dict[str, Any]:
    data = yaml_text.safe_load(DEFAULT_TABLE_PATH.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def stricter_xid13() -> dict[str, Any]:
    """XID 13 resets the GPU instead of restarting the job: the one difference."""
    data = copy.deepcopy(packaged())
    for row in data["xid"]["rules"]:
        if row["codes"] == [13]:
            row["action"] = "reset_gpu"
            row["severity"] = "critical"
    return data


def rollout(*stages: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"candidate": stricter_xid13(), "stages": list(stages), **extra}
