"""A real hang, found with its culprit, on the embedded default.

Four real ranks of examples/torch_allreduce.py all-reduce over gloo and report their
progress per rank; the test SIGSTOPs rank 2's process group. The other three wait in the
all-reduce it never enters (or it stopped inside it); the local adapter reads every rank's
heartbeat, the policy names rank 2 once no rank progressed for 3 x the job's p99 step time
(floored), its node gets ``HangInJob`` with the evidence, triage restarts the job in place
(the node checks healthy), the stopped rank is killed after the grace period, and attempt 2
resumes from the newest checkpoint and steps on.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.cli.demo import CLUSTER_SPEC, demo_compute_options
from services.job_submission import commands as job_commands
from services.wiring.embedded import EmbeddedApp, embedded
from shared.adapters.compute.attempt_scan import TIER_SCAN_S
from shared.adapters.compute.protocol import progress_path
from shared.adapters.compute.rank_progress import RankWatch
from shared.config import ControlPlaneConfig
from shared.domain.events import NodeHealthReported
from shared.domain.model import Job, JobState
from shared.policies.hangs import HangConfig
from shared.service_layer.gangs import output_dirs

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
CLUSTER = {**CLUSTER_SPEC, "nodePools": [{**CLUSTER_SPEC["nodePools"][0], "nodeCount": 5}]}
FLOOR_S = 3.0  # the machine is shared: a rank descheduled for a second is no hang


def spec(steps: int) -> dict[str, Any]:
    return {"displayName": "allreduce", "jobSpec": {
        "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g",
                            "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
            "replicaCount": 4,
            "containerSpec": {"imageUri": "local/examples:latest",
                              "command": [sys.executable, str(ROOT / "examples" /
                                                              "torch_allreduce.py")],
                              "args": ["--steps", str(steps), "--step-time", "0.05",
                                       "--checkpoint-every", "20", "--beat-every", "0.5"]}}],
        "scheduling": {"partition": "train", "restartJobOnWorkerRestart": False}}}


def start(tmp_path: Path) -> EmbeddedApp:
    config = replace(ControlPlaneConfig(), grace_period_s=2.0, heartbeat_timeout_s=60)
    app = embedded(tmp_path / "state", config=config, compute_options=demo_compute_options())
    app.compute.scan.ranks = RankWatch(hang=HangConfig(floor_s=FLOOR_S))
    with app.transaction() as uow:
        job_commands.create_cluster(CLUSTER, uow, app.deps)
    assert app.run(lambda: _cluster_ready(app), timeout_s=30)
    return app


def _cluster_ready(app: EmbeddedApp) -> bool:
    with app.uow() as uow:
        cluster = uow.clusters.get("demo")
    return cluster is not None and cluster.state.value == "READY"


def job(app: EmbeddedApp, job_id: str) -> Job:
    with app.uow() as uow:
        found = uow.jobs.get(job_id)
    assert found is not None
    return found


def beat(ckpt: str, rank: int) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(progress_path(ckpt, rank).read_text())
        return data
    except (OSError, ValueError):
        return {}


def hang_reports(app: EmbeddedApp) -> list[dict[str, Any]]:
    assert app.deps.event_log is not None
    return [d for d in app.deps.event_log.read() if d["type"] == NodeHealthReported.TYPE
            and any(c["type"] == "HangInJob" and c["status"] == "true"
                    for c in d["data"]["conditions"])]


@pytest.mark.slow
def test_sigstop_of_one_rank_is_found_named_and_the_job_resumes(tmp_path: Path) -> None:
    app = start(tmp_path)
    try:
        with app.transaction() as uow:
            job_commands.submit_job("demo", spec(100_000), uow, app.deps, "hang-1")
        assert app.run(lambda: len(app.compute.workers("hang-1")) == 4, timeout_s=30)
        first = job(app, "hang-1")
        workers = {w.rank: w for w in app.compute.workers("hang-1")}
        ckpt = str(Path(_checkpoint_dir(app, "hang-1")))
        # every rank past step 30: the job's own step times are known
        assert app.run(lambda: all(beat(ckpt, r).get("step", 0) >= 30 for r in range(4)),
                       timeout_s=240)
        stopped_at = time.time()
        os.killpg(os.getpgid(workers[2].pid), signal.SIGSTOP)
        assert app.run(lambda: bool(hang_reports(app)), timeout_s=120)
        (report,) = hang_reports(app)
        cond = next(c for c in report["data"]["conditions"] if c["type"] == "HangInJob")
        details = cond["details"]
        assert report["data"]["node_id"] == workers[2].node_id  # the culprit's node
        # (stopped before entering the all-reduce the others wait in, or inside it)
        assert details["culprit"] == 2 and "rank 2" in cond["reason"]
        assert "did not enter all_reduce" in cond["reason"] or "stopped" in cond["reason"]
        # within the threshold (3 x p99, floored) plus one report interval (and a poll)
        detected = report["data"]["observed_at"] - stopped_at
        assert detected <= details["threshold_s"] + TIER_SCAN_S + 1.0, (detected, details)
        # the job restarts in place (the node checks healthy) and steps on
        assert app.run(lambda: job(app, "hang-1").attempt >= 2, timeout_s=60)
        again = job(app, "hang-1")
        assert again.state is JobState.RUNNING and tuple(again.node_ids) == tuple(first.node_ids)
        assert again.recovery.hung_on == [workers[2].node_id]
        assert app.run(lambda: beat(ckpt, 0).get("attempt") == 2
                       and beat(ckpt, 0).get("step", 0) > 30, timeout_s=240)
        print(f"hang-to-report {detected:.2f} s (threshold {details['threshold_s']} s)")
    finally:
        for w in app.compute.workers("hang-1"):
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(w.pid), signal.SIGCONT)
        app.compute.kill_all()
        app.close()


def _checkpoint_dir(app: EmbeddedApp, job_id: str) -> str:
    """AIP_CHECKPOINT_DIR of the job's ranks (the gang's, as the scheduler gave it)."""
    return output_dirs(job(app, job_id), app.deps)[0]
