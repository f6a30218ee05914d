"""In-process restart on the embedded default: an app crash of one rank of
``examples/train.py`` (real processes, real tiers) recovers in place without new processes
for the surviving ranks, loses at most one tier-1 interval and ends with the weights of an
uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mtc_program.inprocess import read_state
from services.cli.bench_live import MACHINE, kill_ranks
from services.job_submission import commands as job_commands
from services.wiring.embedded import EmbeddedApp, embedded
from shared.adapters.compute.local.procs import rank_running
from shared.config import ControlPlaneConfig
from shared.domain.events import JobStarted
from shared.domain.model import Job, JobState

pytestmark = pytest.mark.slow  # real worker subprocesses

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train.py"
ARGS = ("--steps", "160", "--checkpoint-every", "40", "--step-time", "0.05")
TIER1_EVERY = 5
JOB = "inproc-1"
CLUSTER = {"clusterId": "ip", "displayName": "in-process restart",
           "nodePools": [{"id": "h100", "nodeCount": 3, "machineSpec": MACHINE}],
           "partitions": [{"name": "train", "nodePoolIds": ["h100"]}]}
SPEC = {"displayName": "inproc", "labels": {"mtc-recovery-mode": "in_place"}, "jobSpec": {
    "workerPoolSpecs": [{"machineSpec": MACHINE, "replicaCount": 3, "containerSpec": {
        "imageUri": "local/examples:latest", "command": [sys.executable, str(EXAMPLE)],
        "args": list(ARGS),
        "env": [{"name": "MTC_TIER1_EVERY", "value": str(TIER1_EVERY)},
                {"name": "MTC_PROGRESS_INTERVAL_S", "value": "0.1"}]}}],
    "scheduling": {"partition": "train", "restartJobOnWorkerRestart": True}}}


def program_pid(launcher: int) -> int:
    """The rank's program: the launcher's one child."""
    [child] = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    return int(child)


def job(app: EmbeddedApp) -> Job:
    with app.uow() as uow:
        found = uow.jobs.get(JOB)
    assert found is not None
    return found


def chief_step(app: EmbeddedApp) -> int:
    """Rank 0's step, from its heartbeat (``MTC_PROGRESS_FILE``)."""
    for path in Path(app.deps.config.output_root).rglob("mtc-progress/rank-0.json"):
        try:
            return int(json.loads(path.read_text())["step"])
        except (OSError, ValueError, KeyError):
            return 0
    return 0


def standbys(app: EmbeddedApp) -> dict[str, int]:
    """The job's warm standbys that run and declared, by node: their launcher pids."""
    with app.compute.store.tx() as db:
        rows = db.execute("SELECT * FROM standbys WHERE job_id = ? AND pid IS NOT NULL",
                          (JOB,)).fetchall()
    return {r["node_id"]: r["pid"] for r in rows
            if rank_running(r) and read_state(Path(r["control_file"])).get("pid")}


def test_an_app_crash_restarts_the_survivors_in_their_processes(tmp_path: Path) -> None:
    config = replace(ControlPlaneConfig(), output_root=tmp_path / "jobs", grace_period_s=10.0)
    app = embedded(tmp_path / "state", config=config,
                   compute_options={"provision_duration_s": 0.1, "agent_interval_s": 0.5})
    try:
        with app.transaction() as uow:
            job_commands.create_cluster(CLUSTER, uow, app.deps)
        assert app.run(lambda: ready(app), timeout_s=30)
        with app.transaction() as uow:
            job_commands.submit_job("ip", SPEC, uow, app.deps, JOB)
        assert app.run(lambda: chief_step(app) >= 20  # and the control plane knows of a copy
                       and job(app).recovery.tiers.get("memory") is not None,
                       timeout_s=60, poll_s=0.02)
        first = {w.rank: w for w in app.compute.workers(JOB) if w.attempt == 1}
        # one warm standby per node of the job, started, imported and waiting
        assert app.run(lambda: len(standbys(app)) == 3, timeout_s=30, poll_s=0.05)
        warm = standbys(app)
        assert not set(warm.values()) & {w.pid for w in first.values()}  # never a rank
        programs = {r: program_pid(w.pid) for r, w in first.items()}
        at_fault = chief_step(app)
        kill_ranks(app.compute, JOB, 1, first[1].node_id)  # rank 1's program crashes
        assert app.run(lambda: job(app).attempt >= 2, timeout_s=30, poll_s=0.02)
        again = {w.rank: w for w in app.compute.workers(JOB) if w.attempt == 2}
        assert job(app).recovery.decisions[-1]["mode"] == "in_place", job(app).recovery.decisions
        for rank in (0, 2):  # the survivors: the same launcher, the same program
            assert again[rank].pid == first[rank].pid
            assert program_pid(again[rank].pid) == programs[rank]
        assert again[1].pid != first[1].pid  # the crashed rank: the node's warm standby
        assert again[1].pid == warm[first[1].node_id]
        assert "ready: waiting to be given a rank" in Path(
            app.compute.state_dir, "logs", JOB, f"standby-{first[1].node_id}.log").read_text()
        # and a new standby takes its place on that node
        assert app.run(lambda: standbys(app).get(first[1].node_id, again[1].pid)
                       != again[1].pid, timeout_s=30, poll_s=0.05)
        assert app.run(lambda: job(app).terminal, timeout_s=90, poll_s=0.05)
        done_job = job(app)
        assert done_job.state is JobState.SUCCEEDED
        last = standbys(app)
        assert app.run(lambda: not standbys(app), timeout_s=10)  # ended with the job
        with app.compute.store.tx() as db:
            assert db.execute("SELECT COUNT(*) FROM standbys").fetchone()[0] == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in last.values())
        # the bookkeeping is as for a process restart: an attempt started, counted, measured
        assert done_job.restart_count == 1 and done_job.attempt == 2
        assert done_job.recovery.decisions[-1]["measured_s"] is not None
        assert app.deps.event_log is not None
        started = [d["data"]["attempt"] for d in app.deps.event_log.read()
                   if d["type"] == JobStarted.TYPE and d["data"].get("job_id") == JOB]
        assert started == [1, 2]
        log = Path(again[0].log_path).read_text()  # the attempt's own log, in process
        found = re.search(r"restoring step (\d+) from the \w+ tier", log)
        assert found is not None, log
        restored = int(found[1])
        assert restored >= at_fault - TIER1_EVERY
        assert "held at step" in Path(first[0].log_path).read_text()
        [model] = list(Path(config.output_root).rglob("model/model.npz"))
        plain = tmp_path / "plain"
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), *ARGS[:4]], capture_output=True, text=True,
            timeout=60, env={"PATH": os.environ.get("PATH", ""),
                             "AIP_CHECKPOINT_DIR": str(plain / "c"),
                             "AIP_MODEL_DIR": str(plain / "m")})
        assert done.returncode == 0, done.stderr
        with np.load(model) as a, np.load(plain / "m" / "model.npz") as b:
            assert a.files == b.files
            for k in a.files:
                assert a[k].tobytes() == b[k].tobytes(), k
    finally:
        app.compute.kill_all()
        app.close()


def ready(app: EmbeddedApp) -> bool:
    with app.uow() as uow:
        cluster = uow.clusters.get("ip")
    return cluster is not None and cluster.state.value == "READY"
