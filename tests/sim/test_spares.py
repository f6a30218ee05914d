"""``mtc sim plan-spares``: the smallest spare count meeting a target, and its plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator import cli, spares
from tests.sim.conftest import scenario_file

# 16 nodes that all train: a reboot takes 30 min, a dead host is replaced in 8 h; without a
# spare every interruption waits for the repair.
FLEET = {
    "name": "sp", "seed": 2, "duration": "4d",
    "cluster": {"cluster_id": "sp", "provision": "5m",
                "partitions": [{"name": "train", "nodes": 16, "spares": 0}]},
    "jobs": [{"name": "train", "nodes": 16, "step_time": "10s", "checkpoint_interval": "30m",
              "checkpoint_save": "20s", "startup": "2m"}],
    "failures": {"causes": {
        "gpu_off_bus": {"per_1000_node_days": 60, "signal": {"xid": [79]}, "fix": "reboot"},
        "dead_host": {"per_1000_node_days": 20, "signal": {"heartbeat_lost": True},
                      "fix": "replace"}}},
    "repair": {"durations": {"reboot": "30m", "replace": "8h"}},
    "detection": {"xid": "10s"},
    "bus": {"latency": "50ms"},
}


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return scenario_file(tmp_path, FLEET)


def test_spare_waits_and_p95() -> None:
    rows = [{"type": "mtc.job.requeued.v1", "time": 10.0, "data": {"job_id": "j"}},
            {"type": "mtc.job.started.v1", "time": 70.0, "data": {"job_id": "j"}},
            {"type": "mtc.job.requeued.v1", "time": 100.0, "data": {"job_id": "j"}},
            {"type": "mtc.node.provisioned.v1", "time": 400.0, "data": {"node_id": "n"}}]
    assert spares.spare_waits(rows) == [60.0, 300.0]  # the second never restarted
    assert spares.p95(list(range(1, 101))) == 95 and spares.p95([]) == 0.0


@pytest.mark.slow
def test_plan_finds_the_smallest_count_that_meets_the_wait_target(scenario: Path,
                                                                  tmp_path: Path) -> None:
    plan = spares.plan_spares(scenario, [4, 0, 2, 1], replications=2, max_p95_wait_s=600)
    assert [p.spares for p in plan.points] == [0, 1, 2, 4]
    none, one, two, four = plan.points
    assert none.p95_wait_s > 3600 and not none.meets  # waits for repairs
    assert none.p95_wait_s >= one.p95_wait_s >= two.p95_wait_s >= four.p95_wait_s
    assert four.meets and plan.best == min(p.spares for p in plan.points if p.meets)
    assert two.goodput > none.goodput
    assert four.fleet_goodput < two.fleet_goodput  # idle spares cost the fleet
    png = spares.plot(plan, tmp_path / "out" / "curve.png", max_p95_wait_s=600)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_cli_goodput_floor_and_bad_input(scenario: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    code = cli.main(["plan-spares", str(scenario), "--spares", "0,1", "--goodput-floor",
                     "0.35", "--replications", "2", "--out", str(out), "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["best"] == 1 and (out / "plan-spares.png").is_file()
    assert json.loads((out / "plan-spares.json").read_text()) == plan
    # a floor no count reaches: exit 1, said plainly
    assert cli.main(["plan-spares", str(scenario), "--spares", "0", "--goodput-floor", "0.99",
                     "--replications", "1", "--out", str(out)]) == 1
    assert "no spare count tried meets it" in capsys.readouterr().out
    assert cli.main(["plan-spares", str(scenario), "--spares", "x", "--p95-wait", "10m",
                     "--out", str(out)]) == 2
