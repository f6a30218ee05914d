"""`mtc bench recovery --target slurm` end to end: a one-fault trace on a private Slurm cluster
the command starts and stops itself (not the session's cluster fixture)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from services.cli.main import main

pytestmark = pytest.mark.slow  # a Slurm cluster, real ranks

TRACE = {
    "version": 1, "name": "slurm-e2e", "cluster": {"nodes": 2, "spares": 0, "repair": 2},
    "job": {"replicas": 2, "step_time": 0.05, "checkpoint_every": 10, "tier1_every": 5},
    "faults": [{"kind": "app_crash", "at": 1, "target": {"rank": 1}},
               {"kind": "node_lost", "at": 1, "target": {"rank": 0}}],
}


def test_an_app_crash_on_slurm_is_played_and_scored(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0 or shutil.which("slurmctld") is None:
        pytest.skip("needs root and Slurm installed (scripts/slurm/cluster.sh)")
    trace = tmp_path / "slurm-e2e.yaml"
    trace.write_text(yaml.safe_dump(TRACE))
    code = main(["--state-dir", str(tmp_path / "state"), "bench", "recovery", "--target",
                 "slurm", "--trace", str(trace), "--json", "--timeout", "60"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    [run] = doc["runs"]
    assert run["target"] == "slurm" and run["label"] == "chosen"
    [crash] = run["incidents"]
    assert crash["kind"] == "app_crash" and crash["stopped"]  # a new batch job
    assert crash["detected_s"] is not None and 0 <= crash["detected_s"] < crash["recovered_s"]
    assert crash["steps_lost"] is not None and 0 <= crash["steps_lost"] <= 5  # one tier-1 interval
    assert crash["resume_step"] is not None and crash["resume_step"] > 0  # restored, not step 0
    assert [s["kind"] for s in run["skipped"]] == ["node_lost"]
    assert run["goodput"]["restarts"] >= 1
