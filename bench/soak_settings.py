"""The chaos soak's settings: every constant, with its unit, in one block, and the specs of
the clusters and jobs it submits (``bench/soak.py`` runs them).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from shared.domain.model import NodeState

ROOT = Path(__file__).resolve().parents[1]

# All times in seconds unless the name says otherwise.
STEP_TIME_S = 0.05  # train.py sleeps this per step
CHECKPOINT_EVERY_STEPS = 10  # a checkpoint every 0.5 s of training
SHORT_STEPS = (30, 120)  # 1.5-6 s of training
LONG_STEPS = (400, 1200)  # 20-60 s of training (capped at a third of the run)
LONG_JOB_FRACTION = 0.25
REPLICA_CHOICES = (1, 1, 2, 2, 4)  # drawn uniformly: sizes 1, 2 and 4
CANCEL_FRACTION = 0.1  # jobs the soak cancels at a random time
RESTART_ANYWAY_FRACTION = 0.5  # jobs whose spec says restartJobOnWorkerRestart
SUBMIT_WINDOW_FRACTION = 0.6  # jobs are submitted over the first 60% of the run
AUX_CLUSTER_NODES = 2  # the second cluster's worker nodes
AUX_JOB_FRACTION = 0.1  # jobs that go to the second cluster
SPARE_NODES = 1  # hot spares of the main cluster (part of --nodes)

CHAOS_MEAN_INTERVAL_S = 1.5  # mean gap between chaos actions (exponential)
CHAOS_WEIGHTS: dict[str, float] = {  # relative odds of each chaos kind
    "fault": 5.0, "worker_kill": 3.0, "controller_kill": 1.0, "cli_pump": 0.7,
    "replay": 2.0, "stale_report": 1.0, "hang": 0.3, "operator_drain": 0.3,
}
FAULT_KINDS = ("xid", "ecc_dbe", "row_remap_failure", "dcgm", "thermal", "disk", "slow")
# XIDs drawn for "xid" faults: reset, reboot, application-level and (rarely) manual ones
XID_CHOICES = (79, 79, 48, 48, 74, 62, 13, 94, 54)
WORKER_KILL_KINDS = ("rank", "all_ranks", "launcher")
REPLAY_KINDS = ("duplicate", "delayed", "reordered", "expired")
# kinds a soak must show at least once: past this fraction of the chaos window, a draw that
# would pick something else picks a missing one instead (a short soak is otherwise left to luck)
CHAOS_MUST_HAPPEN = ("fault", "worker_kill", "controller_kill")
CHAOS_COVERAGE_FROM = 0.3
CONTROLLER_DOWN_S = (0.2, 2.0)  # a killed controller stays down this long
CLI_PUMP_BUDGET_S = 1.0  # a second process pumps this long (as a CLI command does)

CHECK_EVERY_S = 3.0  # invariants checked this often
OPERATOR_DRAINS_AT_ONCE = 1  # a second operator drain lifts the first instead
PROGRESS_EVERY_S = 5.0  # a progress line this often
SETTLE_S = 120.0  # after the chaos: time for every job to end and every node to settle
STUCK_JOB_S = 120.0  # a job with no state change and no new checkpoint this long is stuck
STUCK_NODE_S = 90.0  # a node in a transient state this long is stuck
PLACEMENT_SLACK_S = 3.0  # work started this soon after a fault may not have seen it yet
CAUSE_SLACK_S = 10.0  # a fault this long before a node's return may still explain its drain
STALE_WATCH_S = 20.0  # a drain this soon after a stale report/replay names it in the detail
FINAL_QUIET_S = 20.0  # at the end: a job or node unchanged this long (with room) has not settled
RETENTION_SLACK_S = 20.0  # beyond retention + prune interval before the store is over bound

# the control plane's settings for the soak (passed to the controller child as JSON)
SETTINGS: dict[str, Any] = {
    "grace_period_s": 5.0,
    "heartbeat_timeout_s": 30.0,
    "max_event_age_s": 30.0,
    "retention_s": 30.0,
    "idempotency_retention_s": 30.0,
    "prune_interval_s": 5.0,
    "max_out_of_service_fraction": 0.5,
    "blast_window_s": 30.0,
    "alert_reminder_s": 20.0,  # a held node with the same fault is diagnosed again this often
    "repair_durations_s": {"reset_gpu": 0.5, "reboot": 1.0, "reimage": 2.0, "replace": 2.0},
    "provision_duration_s": 0.3,
    "agent_interval_s": 0.5,
    "controller_poll_s": 0.05,
    "tick_s": 2.0,
}
EVICT_BOUND_S = SETTINGS["grace_period_s"] + 20.0  # a job leaves a faulty node within this
GANG_END_BOUND_S = SETTINGS["grace_period_s"] + 15.0  # one rank dead: the rest end within this
ORPHAN_BOUND_S = SETTINGS["grace_period_s"] + 15.0  # an ended attempt's processes go within this
HELD_BOUND_S = SETTINGS["alert_reminder_s"] + 15.0  # a held node is diagnosed again by then

MAIN, AUX = "soak", "soak-aux"
TRANSIENT = frozenset({NodeState.PROVISIONING, NodeState.DRAINING, NodeState.DRAINED,
                       NodeState.REPAIRING, NodeState.VERIFYING})
OUT_OF_SERVICE = frozenset({NodeState.DRAINING, NodeState.DRAINED, NodeState.REPAIRING,
                            NodeState.VERIFYING, NodeState.FAILED})
TAKES_NODE_OUT = frozenset({"reset_gpu", "reboot", "reimage", "replace", "manual"})
MACHINE = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
           "acceleratorCount": 8}


def cluster_spec(cluster_id: str, nodes: int, spares: int) -> dict[str, Any]:
    return {
        "clusterId": cluster_id, "displayName": f"chaos soak ({cluster_id})",
        "loginNode": {"machineType": "n2-standard-8"},
        "nodePools": [{"id": "gpu", "nodeCount": nodes, "spareCount": spares,
                       "machineSpec": MACHINE}],
        "partitions": [{"name": "train", "nodePoolIds": ["gpu"]}],
    }


def job_spec(replicas: int, steps: int, seed: int, restart_anyway: bool) -> dict[str, Any]:
    return {
        "displayName": f"soak-{replicas}x{steps}",
        "jobSpec": {
            "workerPoolSpecs": [{
                "machineSpec": MACHINE, "replicaCount": replicas,
                "containerSpec": {
                    "imageUri": "local/examples:latest",
                    "command": [sys.executable, str(ROOT / "examples" / "train.py")],
                    "args": ["--steps", str(steps), "--checkpoint-every",
                             str(CHECKPOINT_EVERY_STEPS), "--step-time", str(STEP_TIME_S),
                             "--seed", str(seed)],
                },
            }],
            "scheduling": {"partition": "train", "restartJobOnWorkerRestart": restart_anyway},
        },
    }
