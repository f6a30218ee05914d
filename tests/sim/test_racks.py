"""Racks in the twin: a rack event takes its nodes together; the real
control plane drains the rack once and moves the job; without racks nothing changes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from simulator import twin
from simulator.readers import ScenarioError
from simulator.scenario import parse_scenario
from tests.sim.conftest import scenario

DRAINED = "mtc.domain.drained.v1"


def rack_raw(*, drain: bool = True, layout: str = "perPartition") -> dict[str, Any]:
    """16 workers and 4 spares on racks of 4 (5 racks), a 16-node job, no random faults, one
    scripted rack event (every node of rack 0 goes silent) at 2 h; a reboot fixes it."""
    return {
        "name": "rack", "seed": 3, "duration": "12h",
        "cluster": {"cluster_id": "r", "partitions": [{
            "name": "train", "nodes": 16, "spares": 4, "nodes_per_rack": 4,
            "spare_layout": layout}], "provision": "5m"},
        "jobs": [{"name": "train", "nodes": 16, "step_time": "10s",
                  "checkpoint_interval": "30m", "checkpoint_save": "20s",
                  "checkpoint_restore": "1m", "startup": "2m"}],
        "failures": {"causes": {"rack_event": {"per_1000_node_days": 0, "group": "rack",
                                               "signal": {"heartbeat_lost": True},
                                               "fix": "reboot"}},
                     "scripted": [{"at": "2h", "node": 0, "cause": "rack_event"}]},
        "repair": {"durations": {"reboot": "15m"}},
        "bus": {"latency": "50ms"},
        "control_plane": {"repair": {"domain_drain_fraction": 0.5 if drain else 0.0,
                                     "max_out_of_service_fraction": 0.5}},
    }


def test_a_scripted_rack_event_drains_the_rack_once_and_moves_the_job() -> None:
    result = twin.run(scenario(rack_raw()))
    drained = [r["data"] for r in result.rows if r["type"] == DRAINED]
    assert len(drained) == 1 and drained[0]["domain"] == "train-rack-0"
    assert not drained[0]["held"] and len(drained[0]["node_ids"]) == 4
    assert result.failures["rack_event"] == 4  # one event, its rack's four nodes
    assert result.interruptions == {"rack_event": 1}
    assert result.repairs["reboot"] == 4
    assert result.job_states["train"] == "JOB_STATE_RUNNING"  # moved, still training
    # the first silent node is seen alone (1 of 4: repaired per node, the job restarts
    # on a spare); the second drains the rack, and the job moves off it for good
    starts = [r["data"] for r in result.rows if r["type"] == "mtc.job.started.v1"]
    assert len(starts) == 3
    assert not set(starts[-1]["node_ids"]) & set(drained[0]["node_ids"])


def test_without_drain_the_rack_event_is_repaired_node_by_node() -> None:
    result = twin.run(scenario(rack_raw(drain=False)))
    assert [r for r in result.rows if r["type"] == DRAINED] == []
    assert result.failures["rack_event"] == 4


def test_per_rack_spares_are_spread_over_the_racks() -> None:
    spread = twin.cluster_body(scenario(rack_raw(layout="perRack")))
    assert spread["nodePools"][0]["topology"] == {"nodesPerRack": 4, "spareLayout": "perRack"}


def test_a_scenario_without_racks_asks_for_no_topology() -> None:
    raw = copy.deepcopy(rack_raw())
    del raw["cluster"]["partitions"][0]["nodes_per_rack"]
    del raw["cluster"]["partitions"][0]["spare_layout"]
    body = twin.cluster_body(parse_scenario(raw))
    assert "topology" not in body["nodePools"][0]


def test_a_bad_rack_setting_names_its_path() -> None:
    raw = rack_raw(layout="perRow")
    with pytest.raises(ScenarioError, match=r"cluster\.partitions\[0\]\.spare_layout"):
        parse_scenario(raw)
    raw = rack_raw()
    raw["failures"]["causes"]["rack_event"]["group"] = "row"
    with pytest.raises(ScenarioError, match=r"failures\.causes\.rack_event\.group"):
        parse_scenario(raw)
