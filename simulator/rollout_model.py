"""A software rollout in the twin: the scenario's ``rollout`` block, the compute side of an
update, and what the rollout cost.

The rollout itself is the control plane's (``services.repair.rollout``): the twin starts it
through the same call the API makes, at ``at`` after the cluster is ready, and its compute
stages the version (``SoftwareImages``); the simulated reimage writes it. With ``bad: true``
the new version fails the deep-check gate on every node it reaches (the way a broken driver
shows), so the first wave's gate pauses and rolls the rollout back; otherwise a node passes or
fails its checks by its own faults, as after any repair. Sweeping ``rollout.wave_size``
answers "how big a wave, at what goodput cost": the sweep's rows carry goodput as always, and
``rollout_state`` and ``rollout_h`` (how long the rollout took, hours) beside it.

```yaml
rollout:
  at: 1h              # after the cluster is ready
  version: {driver: "560.35"}
  wave_size: 4
  canary: 1
  bad: false          # true: the new version fails the deep-check gate
  gate_tolerance: 0   # the share of updated nodes that may fail the gate (0: any one regresses)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.readers import (
    ScenarioError,
    boolean,
    duration,
    integer,
    mapping,
    number,
    only_keys,
)

KEYS = ("at", "version", "wave_size", "canary", "bad", "gate_tolerance")


@dataclass(frozen=True)
class RolloutCfg:
    at_s: float = 3600.0
    version: Mapping[str, str] = field(default_factory=lambda: {"nodeImage": "sim-next"})
    wave_size: int = 1
    canary: int = 1
    bad: bool = False
    gate_tolerance: float = 0.0  # the share of updated nodes that may fail the gate

    def body(self) -> dict[str, Any]:
        """The ``:rolloutSoftware`` body that starts it."""
        return {"version": dict(self.version), "waveSize": self.wave_size,
                "canary": self.canary, "gateTolerance": self.gate_tolerance}


def parse_rollout(value: Any, path: str) -> RolloutCfg | None:
    if value is None:
        return None
    data = mapping(value, path)
    only_keys(data, path, KEYS)
    version = mapping(data.get("version", {"nodeImage": "sim-next"}), f"{path}.version")
    if not version or not all(isinstance(v, str | int | float) for v in version.values()):
        raise ScenarioError(f"{path}.version", "must map nodeImage/driver/agent to versions")
    return RolloutCfg(at_s=duration(data.get("at", 3600.0), f"{path}.at"),
                      version={str(k): str(v) for k, v in version.items()},
                      wave_size=integer(data.get("wave_size", 1), f"{path}.wave_size", low=1),
                      canary=integer(data.get("canary", 1), f"{path}.canary", low=0),
                      bad=boolean(data.get("bad", False), f"{path}.bad"),
                      gate_tolerance=number(data.get("gate_tolerance", 0.0),
                                            f"{path}.gate_tolerance", low=0.0, high=0.5))


def outcome(rollouts: list[dict[str, Any]], horizon_at: float) -> dict[str, Any]:
    """The run's rollout as the summary and a sweep's row show it: its state, its waves, how
    long it took (to the end of the run when it had not finished)."""
    if not rollouts:
        return {"state": "NOT_STARTED", "waves": 0, "wave": 0, "hours": None, "reason": ""}
    r = rollouts[0]
    end = r["ended"] if r.get("ended") is not None else horizon_at
    return {"state": r["state"], "waves": len(r["waves"]), "wave": r["wave"] + 1,
            "hours": round((end - r["started"]) / 3600.0, 6), "reason": r["reason"]}
