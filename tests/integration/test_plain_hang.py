"""A hang in a plain program (it imports nothing of mtc and reports no progress), seen from
outside it on the embedded default.

Two real ranks of a program print a step at a steady pace (standard library only, or a gloo
all-reduce per step with torch, where the stopped rank's peer waits in the collective); the test
SIGSTOPs rank 1's process group. The local adapter sees rank 1's processes stopped (``T``)
past the process-level threshold, reports ``HangInJob`` on rank 1's node naming rank 1 with
its stack (or why not), triage restarts the job, and a second attempt starts: long before
the 30-minute watchdog.
"""

from __future__ import annotations

import contextlib
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
from shared.adapters.compute.proc_watch import ProcWatch
from shared.config import ControlPlaneConfig
from shared.domain.events import NodeHealthReported
from shared.domain.model import Job
from shared.policies.process_hangs import ProcessHangConfig

STOPPED_S = 2.0
CLUSTER = {**CLUSTER_SPEC, "nodePools": [{**CLUSTER_SPEC["nodePools"][0], "nodeCount": 3}]}
PROGRAM = """\
import os, sys, time
rank = os.environ.get("RANK", "?")
step = 0
while True:
    step += 1
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.1)
"""
# the same with a real collective: the peer of a stopped rank waits in gloo's all-reduce
GLOO = """\
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, t = dist.get_rank(), torch.ones(1024)
step = 0
while True:
    step += 1
    dist.all_reduce(t)
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.05)
"""


def spec(program: Path) -> dict[str, Any]:
    return {"displayName": "plain", "jobSpec": {
        "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g",
                            "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
            "replicaCount": 2,
            "containerSpec": {"imageUri": "local/examples:latest",
                              "command": [sys.executable, str(program)]}}],
        "scheduling": {"partition": "train", "restartJobOnWorkerRestart": False}}}


def job(app: EmbeddedApp, job_id: str) -> Job:
    with app.uow() as uow:
        found = uow.jobs.get(job_id)
    assert found is not None
    return found


def hang_reports(app: EmbeddedApp) -> list[dict[str, Any]]:
    assert app.deps.event_log is not None
    return [d for d in app.deps.event_log.read() if d["type"] == NodeHealthReported.TYPE
            and any(c["type"] == "HangInJob" and c["status"] == "true"
                    for c in d["data"]["conditions"])]


def printed(app: EmbeddedApp, job_id: str) -> bool:
    return all(Path(w.log_path).exists() and Path(w.log_path).stat().st_size > 0
               for w in app.compute.workers(job_id))


@pytest.mark.slow
@pytest.mark.parametrize("source", ["stdlib", "gloo"])
def test_a_stopped_rank_of_a_plain_program_is_named_and_the_job_restarts(
        tmp_path: Path, source: str) -> None:
    if source == "gloo":
        pytest.importorskip("torch")
    program = tmp_path / "plain.py"
    program.write_text(GLOO if source == "gloo" else PROGRAM)
    config = replace(ControlPlaneConfig(), grace_period_s=1.0, heartbeat_timeout_s=60)
    app = embedded(tmp_path / "state", config=config, compute_options=demo_compute_options())
    app.compute.scan.procs = ProcWatch(ProcessHangConfig(stopped_s=STOPPED_S))
    try:
        with app.transaction() as uow:
            job_commands.create_cluster(CLUSTER, uow, app.deps)
        assert app.run(lambda: _ready(app), timeout_s=30)
        with app.transaction() as uow:
            job_commands.submit_job("demo", spec(program), uow, app.deps, "plain-1")
        assert app.run(lambda: len(app.compute.workers("plain-1")) == 2
                       and printed(app, "plain-1"), timeout_s=60)
        workers = {w.rank: w for w in app.compute.workers("plain-1")}
        stopped_at = time.time()
        os.killpg(os.getpgid(workers[1].pid), signal.SIGSTOP)
        assert app.run(lambda: bool(hang_reports(app)), timeout_s=20)
        (report,) = hang_reports(app)
        cond = next(c for c in report["data"]["conditions"] if c["type"] == "HangInJob")
        assert report["data"]["node_id"] == workers[1].node_id
        assert cond["details"]["culprit"] == 1 and "rank 1" in cond["reason"]
        assert workers[1].node_id in cond["reason"] and "stopped" in cond["reason"]
        stack = cond["details"]["stack"]
        assert "<module>" in stack or stack.startswith("stack: unknown (")
        detected = report["data"]["observed_at"] - stopped_at
        assert detected <= STOPPED_S + 2 * TIER_SCAN_S + 2.0, detected
        assert app.run(lambda: job(app, "plain-1").attempt >= 2, timeout_s=20)
        print(f"hang-to-report {detected:.2f} s: {cond['reason']}\n{stack}")
    finally:
        for w in app.compute.workers("plain-1"):
            with contextlib.suppress(OSError):
                os.killpg(os.getpgid(w.pid), signal.SIGCONT)
        app.compute.kill_all()
        app.close()


def _ready(app: EmbeddedApp) -> bool:
    with app.uow() as uow:
        cluster = uow.clusters.get("demo")
    return cluster is not None and cluster.state.value == "READY"
