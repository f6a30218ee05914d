"""``mtc sim advise``: the twin follows checkpoint_resume's advice and shows the gain."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator import advice, cli
from tests.sim.conftest import scenario_file

# A 16-node job checkpointing every 4 h with a 60 s save, interrupted about every 10 h:
# Young/Daly call for about 35 minutes.
FLEET = {
    "name": "adv", "seed": 2, "duration": "6d",
    "cluster": {"cluster_id": "adv", "provision": "5m",
                "partitions": [{"name": "train", "nodes": 16, "spares": 2}]},
    "jobs": [{"name": "train", "nodes": 16, "step_time": "10s", "checkpoint_interval": "4h",
              "checkpoint_save": "60s", "startup": "2m"}],
    "failures": {"causes": {"gpu_off_bus": {"per_1000_node_days": 150,
                                            "signal": {"xid": [79]}, "fix": "reboot"}}},
    "repair": {"durations": {"reboot": "15m"}},
    "detection": {"xid": "10s"},
    "bus": {"latency": "50ms"},
}


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return scenario_file(tmp_path, FLEET)


def test_following_the_advice_gains_goodput(scenario: Path) -> None:
    out = advice.follow_advice(scenario, replications=2)
    mtbf = 86_400 / (16 * 0.150)  # the scenario's rate: one interruption every 10 h
    young = math.sqrt(2 * 60 * mtbf)
    assert 0.6 * young < out["advised_interval_s"] < 1.6 * young
    assert out["written_interval_s"] == [4 * 3600.0]
    assert out["gain"] > 0 and out["goodput_following_advice"] > out["goodput_as_written"]


def test_cli_writes_the_comparison(scenario: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["advise", str(scenario), "--replications", "2", "--json",
                     "--out", str(tmp_path / "o")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "o" / "advice.json").read_text()) == printed
    assert cli.main(["advise", str(scenario), "--replications", "1"]) == 2
