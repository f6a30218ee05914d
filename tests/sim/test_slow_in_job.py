"""A straggler in the twin as its job sees it: a cause that slows one node's ranks
1.5x and that its own checks do not see. Without per-rank progress the job runs at its pace
until the end; with it the twin reports ``SlowInJob`` as the adapters would (after the
policy's scored steps and one read), repair weighs moving the node by expected cost and the
node is replaced: the slow steps stop counting as program badput."""

from __future__ import annotations

from typing import Any

import pytest

from shared.goodput.totals import Badput
from simulator import twin
from simulator.readers import ScenarioError
from simulator.scenario import parse_scenario
from simulator.slow_in_job import detect_after_s
from tests.sim.conftest import scenario

SLOW_AT = 7_200.0


def slow_raw(rank_progress: bool, slows: float = 1.5) -> dict[str, Any]:
    return {
        "name": "straggler", "seed": 1, "duration": "8h",
        "cluster": {"cluster_id": "s", "partitions": [{"name": "train", "nodes": 4,
                                                       "spares": 1}], "provision": "5m"},
        "jobs": [{"name": "train", "nodes": 4, "step_time": "2s", "checkpoint_interval": "600s",
                  "checkpoint_save": "5s", "checkpoint_restore": "30s", "startup": "60s",
                  "rank_progress": rank_progress}],
        "failures": {"causes": {"throttled": {"per_1000_node_days": 0, "kills_job": False,
                                              "signal": {}, "fix": "reboot", "slows": slows}},
                     "scripted": [{"at": f"{SLOW_AT:.0f}s", "node": 2, "cause": "throttled"}]},
        "repair": {"durations": {"reboot": "10m"}},
        "detection": {"xid": "0s"},
        "bus": {"latency": "0s"},
        "checkpoint_events": "all",  # the control plane knows the job's checkpoints (costs)
    }


def slowdown(result: twin.RunResult) -> float:
    return sum(s for (cat, _), s in result.job().badput.items()
               if cat is Badput.PROGRAM_SLOWDOWN)


def test_a_straggler_seen_by_its_job_is_moved_and_its_badput_stops() -> None:
    blind = twin.run(scenario(slow_raw(False)))
    seen = twin.run(scenario(slow_raw(True)))
    assert not [t for t in blind.timeline if t[1] == "slow found"]
    found = [t for t in seen.timeline if t[1] == "slow found"]
    assert len(found) == 1
    at, _, node, _ = found[0]
    slowed_at = next(t for t, kind, n, _ in seen.timeline if kind == "slowed" and n == node)
    assert at - slowed_at == detect_after_s(2.0, 1.5)
    diagnosed = [r["data"] for r in seen.rows if r["type"] == "mtc.node.diagnosed.v1"]
    assert [(d["node_id"], d["failure_mode"]) for d in diagnosed] == [(node, "slow_in_job")]
    draining = [r["data"]["node_id"] for r in seen.rows if r["type"] == "mtc.node.draining.v1"]
    assert draining == [node]  # moved off: 1.5x over the job's horizon costs more than a move
    # the blind job runs a third slower from the fault to the end: program badput; the one
    # that sees it pays a restart instead
    assert slowdown(blind) > 0.3 * (8 * 3600 - SLOW_AT) / 1.5 * 0.9
    assert slowdown(seen) < 0.1 * slowdown(blind)
    assert seen.job().nominal_s > blind.job().nominal_s + 1000  # more training done
    assert seen.job_states == {"train": "JOB_STATE_RUNNING"}


def test_a_slowdown_under_the_margin_is_not_flagged() -> None:
    seen = twin.run(scenario(slow_raw(True, slows=1.1)))  # the policy's margin is 1.12
    assert not [t for t in seen.timeline if t[1] == "slow found"]
    assert slowdown(seen) > 0


def test_a_slowdown_below_one_is_refused_naming_the_key() -> None:
    with pytest.raises(ScenarioError, match=r"failures\.causes\.throttled\.slows"):
        parse_scenario(slow_raw(True, slows=0.5))
