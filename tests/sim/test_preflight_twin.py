"""Preflight in the twin: the cluster's ``mtc-preflight`` makes each first start
(and each restart on new nodes) pay the mode's time as scheduling badput, and catches a
node with a latent fault (here one that slows its ranks 1.5x and that its own checks do not
see) with the mode's probability: the real policy names it, it is excluded and reported, and
the gang is placed again."""

from __future__ import annotations

from typing import Any

import pytest

from shared.goodput.totals import Badput
from simulator import twin
from simulator.readers import ScenarioError
from simulator.scenario import parse_scenario
from tests.sim.conftest import scenario

T_PREFLIGHT = "mtc.job.preflight_checked.v1"


def raw(preflight: Any) -> dict[str, Any]:
    return {
        "name": "preflight", "seed": 3, "duration": "6h",
        # one node more than the job needs: a gang placed again after a culprit fills at once
        "cluster": {"cluster_id": "p", "partitions": [{"name": "train", "nodes": 5,
                                                       "spares": 1}], "provision": "5m",
                    "preflight": preflight},
        "jobs": [{"name": "train", "nodes": 4, "step_time": "2s", "checkpoint_interval": "600s",
                  "checkpoint_save": "5s", "checkpoint_restore": "30s", "startup": "60s",
                  "submit_at": "10m"}],
        "failures": {"causes": {"bad_link": {"per_1000_node_days": 0, "kills_job": False,
                                             "signal": {}, "fix": "reboot", "slows": 1.5}},
                     "scripted": [{"at": "1m", "node": 0, "cause": "bad_link"}]},
        "repair": {"durations": {"reboot": "10m"}},
        "bus": {"latency": "0s"},
        "checkpoint_events": "all",
    }


def badput(result: twin.RunResult, cat: Badput, cause: str | None = None) -> float:
    return sum(s for (c, why), s in result.job().badput.items()
               if c is cat and (cause is None or why == cause))


def test_off_runs_no_preflight_and_the_latent_node_slows_the_job() -> None:
    off = twin.run(scenario(raw("off")))
    assert not [r for r in off.rows if r["type"] == T_PREFLIGHT]
    assert badput(off, Badput.PROGRAM_SLOWDOWN) > 3000


def test_a_thorough_preflight_catches_the_node_and_costs_its_time() -> None:
    result = twin.run(scenario(raw({"mode": "thorough", "duration": "90s", "catches": 1.0})))
    checks = [r["data"] for r in result.rows if r["type"] == T_PREFLIGHT]
    bad = next(t[2] for t in result.timeline if t[1] == "fault")
    assert [c["failed_node_ids"] for c in checks] == [[bad], []]
    assert [c["finished_at"] - c["started_at"] for c in checks] == [90.0, 90.0]
    assert checks[1]["started_at"] == checks[0]["finished_at"]  # placed again, checked again
    assert bad not in checks[1]["node_ids"]
    assert badput(result, Badput.WAITING_FOR_CAPACITY, "preflight") == pytest.approx(180.0)
    assert badput(result, Badput.PROGRAM_SLOWDOWN) < 60
    first_step = next(float(r["time"]) for r in result.rows
                      if r["type"] == "mtc.job.first_step.v1")
    assert first_step >= checks[1]["finished_at"] + 60  # the processes started after it


def test_a_preflight_that_misses_only_costs_its_time() -> None:
    missed = twin.run(scenario(raw({"mode": "quick", "catches": 0.0})))
    off = twin.run(scenario(raw("off")))
    checks = [r["data"] for r in missed.rows if r["type"] == T_PREFLIGHT]
    assert [c["failed_node_ids"] for c in checks] == [[]]
    assert badput(missed, Badput.WAITING_FOR_CAPACITY, "preflight") == pytest.approx(10.0)
    assert missed.job().nominal_s < off.job().nominal_s


@pytest.mark.parametrize("bad", ["sometimes", {"mode": "quick", "catches": 2},
                                 {"mode": "quick", "how": 1}])
def test_bad_preflight_settings_name_the_key(bad: Any) -> None:
    with pytest.raises(ScenarioError, match=r"cluster\.preflight"):
        parse_scenario(raw(bad))
