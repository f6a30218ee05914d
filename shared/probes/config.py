"""The agent's configuration: one frozen value, loaded from JSON and overridden by flags."""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from shared.domain import validation
from shared.domain.errors import ValidationError

ALL_PROBES: tuple[str, ...] = ("xid", "nvidia_smi", "dcgm", "disk", "speed")


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    node_type: str = ""
    probes: tuple[str, ...] = ALL_PROBES
    # XID source: "dmesg", or a kernel log file such as /var/log/kern.log.
    xid_source: str = "dmesg"
    xid_cursor_path: str | None = None  # persist the cursor so a restarted agent does not repeat
    mounts: tuple[str, ...] = ("/",)
    disk_threshold: float = 0.9
    nvidia_smi_path: str = "nvidia-smi"
    dcgmi_path: str = "dcgmi"
    dmesg_path: str = "dmesg"
    command_timeout_s: float = 30.0
    dcgm_level: int = 1
    dcgm_timeout_s: float = 120.0
    volatile_dbe_max: int = 0
    speed_baselines_s: Mapping[str, float] = field(default_factory=dict)  # node_type -> seconds
    speed_min_ratio: float = 0.8  # slower than 0.8x of the baseline speed is a problem
    speed_matrix_size: int = 512

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValidationError("node_id", "is required")
        unknown = sorted(set(self.probes) - set(ALL_PROBES))
        if unknown:
            raise ValidationError("probes", f"unknown probes {unknown}, known: {list(ALL_PROBES)}")
        if not 0 < self.disk_threshold <= 1:
            raise ValidationError("disk_threshold", "must be in (0, 1]")
        if self.dcgm_level not in (1, 2, 3, 4):
            raise ValidationError("dcgm_level", "must be 1, 2, 3 or 4")
        for name in ("command_timeout_s", "dcgm_timeout_s", "speed_min_ratio"):
            if getattr(self, name) <= 0:
                raise ValidationError(name, "must be positive")
        object.__setattr__(self, "speed_baselines_s", types.MappingProxyType(dict(self.speed_baselines_s)))

    @property
    def speed_baseline_s(self) -> float | None:
        return self.speed_baselines_s.get(self.node_type)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentConfig:
        """Build from a JSON object; unknown keys are an error (a typo must not go unnoticed)."""
        data = validation.mapping(data, "", noun="a JSON object (the agent's config)")
        validation.only_keys(data, "", (f.name for f in fields(cls)))
        values = dict(data)
        for key in ("probes", "mounts"):
            if key in values:
                if not isinstance(values[key], list | tuple) or not all(
                    isinstance(v, str) for v in values[key]
                ):
                    raise ValidationError(key, "must be a list of strings")
                values[key] = tuple(values[key])
        if "speed_baselines_s" in values and not isinstance(values["speed_baselines_s"], Mapping):
            raise ValidationError("speed_baselines_s", "must be an object of node_type -> seconds")
        return cls(**values)

    @classmethod
    def load(cls, path: str, **overrides: Any) -> AgentConfig:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        if not isinstance(data, dict):
            raise ValidationError("", "config must be a JSON object")
        data.pop("delivery", None)  # the transport and spool: services.node_agent reads it
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data)

    def with_overrides(self, **overrides: Any) -> AgentConfig:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})
