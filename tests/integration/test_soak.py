"""The chaos soak (bench/soak.py) at a small size: zero invariant violations, and chaos did
happen (faults, kills, controller restarts). About 60-90 s on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import Soak

pytestmark = pytest.mark.slow

MINUTES = 0.75  # 45 s of chaos
JOBS = 8
NODES = 6  # plus the 2-node second cluster
SEED = 1
SETTLE_S = 40.0  # after the chaos, for every job to end and every node to settle
STUCK_S = 45.0  # the stuck-job and stuck-node bounds at this size (120/90 s in a full run)


def test_soak_small(tmp_path: Path) -> None:
    soak = Soak(minutes=MINUTES, jobs=JOBS, nodes=NODES, seed=SEED,
                state_dir=tmp_path / "state", settle_s=SETTLE_S, stuck_job_s=STUCK_S,
                stuck_node_s=STUCK_S, quiet=True)
    code = soak.run()
    figs = soak.last_figures
    faults = sum(v for k, v in figs["faults_by_kind"].items() if not k.startswith("on "))
    assert faults > 0, figs
    assert sum(figs["kills_by_kind"].values()) > 0, figs
    assert figs["controller_restarts"] > 0, figs
    assert figs["invariant_checks"] > 0, figs
    details = "\n".join(f"{v['at_s']}s [{v['invariant']}] {v['detail']}"
                        for v in figs["violation_details"])
    assert figs["violations"] == 0, f"{figs['violations']} violation(s):\n{details}"
    assert code == 0
