"""A hang in the twin: a scripted NCCL-style hang on one node of a 4-node job.
Without per-rank progress the ranks wait for the NCCL watchdog (``hang_exit``); with it the
twin does what the adapters do (``rank_progress``): the hang is found at the policy's
threshold plus one read of the heartbeats, named on the node that stopped, and the real
handlers restart the job in place."""

from __future__ import annotations

from typing import Any

from shared.adapters.compute.attempt_scan import TIER_SCAN_S
from shared.policies.hangs import HangConfig, threshold
from simulator import twin
from tests.sim.conftest import scenario

HANG_AT = 10_000.0


def hang_raw(rank_progress: bool) -> dict[str, Any]:
    return {
        "name": "hang", "seed": 1, "duration": "6h",
        "cluster": {"cluster_id": "h", "partitions": [{"name": "train", "nodes": 4,
                                                       "spares": 0}], "provision": "5m"},
        "jobs": [{"name": "train", "nodes": 4, "step_time": "2s", "checkpoint_interval": "600s",
                  "checkpoint_save": "5s", "checkpoint_restore": "30s", "startup": "60s",
                  "crash_exit": "0s", "hang_exit": "600s", "rank_progress": rank_progress}],
        "failures": {"causes": {"nccl_hang": {"per_1000_node_days": 0, "hang": True,
                                              "signal": {}, "fix": "none"}},
                     "scripted": [{"at": f"{HANG_AT:.0f}s", "node": 2, "cause": "nccl_hang"}]},
        "repair": {"instant": True},
        "detection": {"xid": "0s"},
        "bus": {"latency": "0s"},
    }


def restarted_at(result: twin.RunResult) -> float:
    """Simulated seconds (from the create request) of the second attempt's start."""
    starts = [r for r in result.rows if r["type"] == "mtc.job.started.v1"]
    assert len(starts) >= 2, [r["type"] for r in result.rows][-20:]
    return float(starts[1]["time"]) - float(result.rows[0]["time"])


def test_a_hang_is_found_at_the_threshold_on_its_node_not_at_the_nccl_watchdog() -> None:
    blind = twin.run(scenario(hang_raw(False)))
    seen = twin.run(scenario(hang_raw(True)))
    found = [t for t in seen.timeline if t[1] == "hang found"]
    assert len(found) == 1
    at, _, node, _ = found[0]
    fault_at = next(t for t, kind, n, _ in seen.timeline if kind == "fault" and n == node)
    limit = threshold([2.0] * 10, HangConfig())  # 3 x p99 of 2 s steps, floored at 10 s
    assert at - fault_at == limit + TIER_SCAN_S
    reports = [r for r in seen.rows if r["type"] == "mtc.node.health_reported.v1"
               and any(c["type"] == "HangInJob" and c["status"] == "true"
                       for c in r["data"]["conditions"])]
    assert [r["data"]["node_id"] for r in reports] == [node]
    (cond,) = (c for c in reports[0]["data"]["conditions"] if c["type"] == "HangInJob")
    assert cond["details"]["culprit"] == 2
    diagnosed = [r["data"] for r in seen.rows if r["type"] == "mtc.node.diagnosed.v1"]
    assert [(d["node_id"], d["failure_mode"]) for d in diagnosed] == [(node, "hang_in_job")]
    # restarted well before the blind twin's NCCL watchdog let the ranks exit
    assert restarted_at(seen) + 500 < restarted_at(blind)
    assert seen.job().productive_s > blind.job().productive_s
    assert seen.job_states == {"train": "JOB_STATE_RUNNING"}
