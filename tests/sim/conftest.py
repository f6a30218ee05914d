"""Scenarios for the simulator tests, built as plain data so each test shows what it varies."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.scenario import Scenario, parse_scenario


def xid79_raw(**changes: Any) -> dict[str, Any]:
    """A 16-node job whose only failures are XID 79 (a reboot fixes them), about one job
    interruption every 6 hours, 4 spares, no noise: the cleanest test of the control plane."""
    raw: dict[str, Any] = {
        "name": "xid79",
        "seed": 11,
        "duration": "5d",
        "cluster": {"cluster_id": "t", "partitions": [{"name": "train", "nodes": 16,
                                                       "spares": 4}],
                    "provision": "5m"},
        "jobs": [{"name": "train", "nodes": 16, "step_time": "10s",
                  "checkpoint_interval": "30m", "checkpoint_save": "20s",
                  "checkpoint_restore": "1m", "startup": "2m", "mfu": 0.4}],
        "failures": {"reference": {"nodes": 1, "days": 1},
                     "causes": {"gpu_off_bus": {"per_1000_node_days": 250,
                                                "signal": {"xid": [79]}, "fix": "reboot"}}},
        "repair": {"durations": {"reboot": "15m", "reset_gpu": "3m", "reimage": "1h",
                                 "replace": "6h"}},
        "detection": {"xid": "10s"},
        "bus": {"latency": "50ms"},
    }
    for key, value in changes.items():
        raw[key] = value
    return raw


def scenario(raw: dict[str, Any]) -> Scenario:
    return parse_scenario(copy.deepcopy(raw))


@pytest.fixture
def xid79() -> Scenario:
    return scenario(xid79_raw())


def scenario_file(tmp_path: Path, raw: dict[str, Any]) -> Path:
    """``raw`` written as a scenario YAML, for the commands that take a path."""
    path = tmp_path / f"{raw.get('name', 'scenario')}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
