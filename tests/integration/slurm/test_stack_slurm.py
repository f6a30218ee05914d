"""`make stack-slurm` end to end: the emulators, every function under functions-framework
with MTC_COMPUTE=remote, the executor with SlurmCompute, a real Slurm cluster; the story's
every step is checked on what Slurm and the API showed, and nothing it started is left."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.slurm.conftest import REPO, Cluster
from tests.stack_support import pids_of, run_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_production_topology_heals_a_job_on_real_slurm(cluster: Cluster,
                                                           tmp_path: Path) -> None:
    # ``cluster``: Slurm is installed and runs here (else the session skips); the stack
    # starts a cluster of its own on other ports
    check = subprocess.run([str(REPO / "scripts" / "emulators.sh"), "check"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"the Pub/Sub and Firestore emulators are not installed: {check.stderr}")
    state, result_file = tmp_path / "stack", tmp_path / "result.json"
    # 95-120 s here on its own; beside the other integration tests its start (emulators,
    # functions, a Slurm cluster of its own) has taken 56 s and the whole run over 240 s
    out = run_script("stack_slurm.py", "--state-dir", str(state), "--steps", "300",
                     "--json-out", str(result_file), timeout_s=420, drop_env=("SLURM_CONF",))
    result = json.loads(result_file.read_text())
    victim = result["victim"]
    # the fault was seen in Slurm: the node drained, by mtc, in seconds
    assert result["fault_to_drain_s"] is not None and 0 < result["fault_to_drain_s"] < 30
    assert result["drain_reason"].startswith("mtc: gpu_fell_off_bus"), result["drain_reason"]
    assert any(re.search(rf"\b{victim}\s+drain", s["sinfo"]) for s in result["sinfo"]), \
        "no sinfo printed along the story shows the node drained"
    # a checkpoint was saved (on SIGTERM at the latest) and the next attempt resumed from
    # it, on nodes other than the drained one
    assert result["resumed_step"] is not None and result["resumed_step"] > 0
    assert result["fault_to_resumed_s"] > result["fault_to_drain_s"]
    attempts = {int(k): v for k, v in result["attempt_nodes"].items()}
    assert victim in attempts[1] and len(attempts[2]) == 2 and victim not in attempts[2]
    # the node was rebooted, passed its checks and is back: idle in Slurm, not drained
    assert result["victim_final"] == {"state": "idle", "drained": False}
    assert result["state"] == "JOB_STATE_SUCCEEDED" and result["restarts"] == 1
    assert int(result["last_checkpoint"]) == 300
    # every compute call went through the executor, and each was applied
    assert result["executor_counts"].get("applied", 0) >= 10
    assert not result["executor_counts"].get("refused")
    # the job recovers by requeue or, with its memory and peer tiers, by a cheaper mode
    assert "requeued (restart 1)" in out or re.search(r"recovery (hot_swap|in_place|scale_down)",
                                                      out), out[-3000:]
    for line in ("health report [agent]: XID 79", "diagnosed gpu_fell_off_bus",
                 "draining, job train-1 must checkpoint",
                 "repair started: reboot", "back in service", "via pubsub",
                 "stopped functions", "executor (pid", "stopped the Slurm cluster"):
        assert line in out, f"missing {line!r}"
    assert not pids_of(str(state)), "something the stack started is still running"
