"""A software rollout in the twin (simulator.rollout_model): the real control plane's rollout
on the simulated fleet; a bad version is rolled back at its canary; a sweep's rows carry the
rollout's state and length beside goodput, so a sweep of rollout.wave_size prices a wave."""

from __future__ import annotations

import dataclasses

import pytest

from simulator import twin
from simulator.readers import ScenarioError
from simulator.scenario import load_scenario, parse_scenario
from simulator.sweep import Task, run_task


def test_a_rollout_updates_the_fleet_and_costs_goodput() -> None:
    scenario = load_scenario("rollout", {"duration": "2d"})
    result = twin.run(scenario)
    assert result.rollout is not None and result.rollout["state"] == "SUCCEEDED"
    assert result.summary()["rollout"] == result.rollout
    baseline = twin.run(dataclasses.replace(scenario, rollout=None))
    assert result.repairs["reimage"] > baseline.repairs.get("reimage", 0) + 60
    assert result.job().goodput < baseline.job().goodput  # its jobs moved, nodes out


def test_a_bad_version_is_rolled_back_at_its_canary() -> None:
    result = twin.run(load_scenario("rollout", {"rollout.bad": True}))
    assert result.rollout is not None
    assert result.rollout["state"] == "ROLLED_BACK" and result.rollout["wave"] == 1
    assert "deep-check gate" in result.rollout["reason"]


def test_bigger_waves_finish_sooner() -> None:
    hours = {}
    for size in (4, 16):
        point = (("rollout.wave_size", str(size)),)
        row = run_task(Task("rollout", (("rollout.wave_size", size),), point, 0, 7, 120.0))
        assert row["status"] == "ok" and row["rollout_state"] == "SUCCEEDED"
        hours[size] = row["rollout_h"]
    assert hours[16] < hours[4] / 2


@pytest.mark.parametrize(("block", "path"), [
    ({"wave_size": 0}, "rollout.wave_size"), ({"version": {}}, "rollout.version"),
    ({"speed": 1}, "rollout"), ({"bad": "maybe"}, "rollout.bad")])
def test_bad_rollout_blocks_name_the_key(block: dict[str, object], path: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"rollout": block})
    assert path in str(err.value)
