"""Scenario files parse strictly: every bad key or value is named with its path."""

from __future__ import annotations

import pytest

from simulator.failures import LLAMA3_PLANNED, LLAMA3_UNEXPECTED, LLAMA3_UNEXPECTED_TOTAL
from simulator.overrides import apply_override, parse_value
from simulator.scenario import (
    DEFAULT_SCENARIO,
    ScenarioError,
    duration,
    load_raw,
    load_scenario,
    parse_scenario,
)
from tests.sim.conftest import xid79_raw


def test_default_scenario_carries_the_published_llama3_counts() -> None:
    sc = load_scenario()
    assert sc.cluster.nodes == 2048 + 32 and sc.cluster.gpus_per_node == 8
    assert sc.jobs[0].nodes == 2048 and sc.duration_s == 54 * 86400
    raw = load_raw(DEFAULT_SCENARIO)["failures"]["causes"]
    assert {k: v["count"] for k, v in raw.items()} == {
        k: count for k, (_, _, count) in LLAMA3_UNEXPECTED.items()}
    per_node_day = sum(c.rate_per_node_day for c in sc.failures.causes)
    assert per_node_day == pytest.approx(LLAMA3_UNEXPECTED_TOTAL / (2048 * 54))
    assert sc.failures.planned.rate_per_day == pytest.approx(LLAMA3_PLANNED / 54)
    # the categories come from the published table
    assert {c.name: c.category for c in sc.failures.causes}["gpu_hbm3"] == "GPU"


@pytest.mark.parametrize(("path", "value", "named"), [
    (("failures", "causes", "gpu_off_bus", "fix"), {"rebot": 1}, "failures.causes.gpu_off_bus"
                                                                  ".fix.rebot: unknown key"),
    (("jobs",), [{"checkpoint_intervall": "10m"}], "jobs[0].checkpoint_intervall: unknown key"),
    (("jobs",), [{"checkpoint_interval": "ten minutes"}], "jobs[0].checkpoint_interval: must "
                                                          "be a duration"),
    (("cluster", "partitions"), [{"name": "train", "nodes": 0}], "cluster.partitions[0].nodes"
                                                                 ": must be at least 1"),
    (("failures", "causes", "gpu_off_bus", "signal"), {"xid": "79"}, "failures.causes."
                                                                     "gpu_off_bus.signal.xid"),
    (("bus",), {"duplicate": 2}, "bus.duplicate: must be at most 1"),
    (("control_plane",), {"repair": {"ladder": ["reboot", "reset_gpu"]}},
     "control_plane.repair.ladder[1]"),
    (("colour",), "blue", "colour: unknown key"),
])
def test_bad_scenarios_name_the_bad_key(path: tuple[str, ...], value: object,
                                        named: str) -> None:
    raw = xid79_raw()
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ScenarioError) as err:
        parse_scenario(raw)
    assert named in str(err.value)


def test_a_job_larger_than_its_partition_is_refused() -> None:
    raw = xid79_raw()
    raw["jobs"][0]["nodes"] = 40
    with pytest.raises(ScenarioError, match=r"jobs\[0\]\.nodes: needs 40 nodes"):
        parse_scenario(raw)


def test_durations_and_values() -> None:
    assert duration("90s", "x") == 90 and duration("15m", "x") == 900
    assert duration("2h", "x") == 7200 and duration("54d", "x") == 54 * 86400
    assert duration(12, "x") == 12 and duration("50ms", "x") == pytest.approx(0.05)
    assert parse_value("10m") == "10m" and parse_value("4") == 4
    assert parse_value("reset_gpu+reboot") == ["reset_gpu", "reboot"]


def test_overrides_use_aliases_and_dotted_paths() -> None:
    raw = xid79_raw()
    apply_override(raw, "checkpoint_interval", "10m")
    apply_override(raw, "spares", 0)
    apply_override(raw, "control_plane.repair.ladder", ["reset_gpu", "replace"])
    sc = parse_scenario(raw)
    assert sc.jobs[0].checkpoint_interval_s == 600
    assert sc.cluster.partitions[0].spares == 0
    assert sc.control_plane.repair["ladder"] == ["reset_gpu", "replace"]
    with pytest.raises(ScenarioError, match="no list item"):
        apply_override(raw, "jobs.5.nodes", 3)
