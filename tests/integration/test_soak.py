"""The chaos soak (bench/soak.py) at a small size: zero invariant violations, and chaos did
happen (faults, kills, controller restarts, and the storage and client chaos: a full
disk, a damaged state file, stalled clients, a locked store). About 60-100 s on 2 cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import Soak
from bench.soak_chaos import TEETH_MUST_HAPPEN

# alone: its progress deadlines are a loaded 2-core machine's; beside another test process
# (one run in three here) jobs read as stuck
pytestmark = [pytest.mark.slow, pytest.mark.alone]

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
    teeth = figs["storage_and_client_chaos"]
    for kind in TEETH_MUST_HAPPEN:  # each happened and held; a full disk needs root's tmpfs
        ok = teeth[kind] == "ok" or (kind == "disk_full" and teeth[kind].startswith("unknown"))
        assert ok, teeth
    assert figs["damaged_state_refusals"] > 0, figs
    assert all(k.rsplit(" ", 1)[1] in {"200", "404", "503"}
               for k in figs["api_answers_under_chaos"]), figs["api_answers_under_chaos"]
    details = "\n".join(f"{v['at_s']}s [{v['invariant']}] {v['detail']}"
                        for v in figs["violation_details"])
    assert figs["violations"] == 0, f"{figs['violations']} violation(s):\n{details}"
    assert code == 0
