"""``mtc sim sweep --on slurm``: the replications as one job array on the real local cluster,
merged into the same tables as a local sweep with the same seeds."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from simulator import cli

from .conftest import Cluster, timing

pytestmark = pytest.mark.integration

SMALL = Path(__file__).resolve().parents[3] / "simulator" / "scenarios" / "small.yaml"
ARGS = ["sweep", str(SMALL), "--set", "duration=1d", "--vary", "spares=0,4",
        "--replications", "3", "--seed", "5"]


def _without_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("wall_s")} for r in rows]


def test_a_slurm_array_sweep_equals_the_local_sweep(cluster: Cluster, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", cluster.slurm_conf)
    started = time.monotonic()
    assert cli.main([*ARGS, "--on", "slurm", "--out", str(tmp_path / "slurm"),
                     "--slurm-partition", "main"]) == 0
    timing("6-task sweep array (submit to merged)", time.monotonic() - started)
    assert cli.main([*ARGS, "--processes", "1", "--out", str(tmp_path / "local")]) == 0
    on_slurm = json.loads((tmp_path / "slurm" / "summary.json").read_text())
    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    assert len(on_slurm["runs"]) == 6
    assert [(r["spares"], r["seed"]) for r in on_slurm["runs"]] == [
        (s, seed) for s in ("0", "4") for seed in (5, 6, 7)]
    # every field of every run and every aggregate but the wall-clock timings
    assert _without_wall(on_slurm["runs"]) == _without_wall(local["runs"])
    assert _without_wall(on_slurm["summary"]) == _without_wall(local["summary"])
    assert on_slurm["runs"][0]["goodput"] != on_slurm["runs"][3]["goodput"]  # spares matter
    # one result file per array task, each written by a task on a node of the cluster
    work = tmp_path / "slurm" / "slurm"
    assert sorted(p.name for p in (work / "results").glob("*.json")) == [
        f"result-{i:06d}.json" for i in range(6)]
    assert sorted(p.name for p in (work / "logs").glob("task-*.out")) == [
        f"task-0+{i}.out" for i in range(6)]
