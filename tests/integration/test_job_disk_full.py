"""The job side of a full disk: a full disk interrupts a job, it does not fail it.

Real parts: the jobs' output root is a real 8 MiB tmpfs (root mounts it, as CI runs; skipped
where mounting is not allowed), the rank is ``examples/train.py`` under the real launcher on
the embedded default. The disk is filled to its last block while the job trains: its next
checkpoint dies of ENOSPC (exit 1), the launcher reads the full file system at that exit,
and the job is interrupted (PENDING, "disk full at ..."), not FAILED. It waits while the disk
stays full, ticks and all, an alert firing; once the ballast goes it resumes from its
checkpoint and succeeds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.cli.demo import CLUSTER_SPEC, ROOT, demo_compute_options
from services.job_submission import commands as job_commands
from services.wiring.embedded import embedded
from shared.config import ControlPlaneConfig
from shared.domain.model import Job, JobState

SIZE = "8m"
JOB = "disk-1"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> Path:
    """Fill the file system to the last block; the returned file frees it again."""
    ballast = mount / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return ballast


def spec(steps: int) -> dict[str, Any]:
    return {"displayName": "disk-full", "jobSpec": {
        "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g",
                            "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
            "replicaCount": 1,
            "containerSpec": {"imageUri": "local/examples:latest",
                              "command": [sys.executable, str(ROOT / "examples" / "train.py")],
                              "args": ["--steps", str(steps), "--checkpoint-every", "10",
                                       "--step-time", "0.03"]}}],
        "scheduling": {"partition": "train", "restartJobOnWorkerRestart": False}}}


@pytest.mark.slow
def test_a_full_disk_interrupts_the_job_and_it_resumes_from_its_checkpoint(
        small_disk: Path, tmp_path: Path) -> None:
    config = replace(ControlPlaneConfig(), output_root=small_disk / "jobs")
    app = embedded(tmp_path / "state", config=config, compute_options=demo_compute_options())

    def job() -> Job:
        with app.uow() as uow:
            found = uow.jobs.get(JOB)
        assert found is not None
        return found

    def ready() -> bool:
        with app.uow() as uow:
            cluster = uow.clusters.get("demo")
        return cluster is not None and cluster.state.value == "READY"

    try:
        with app.transaction() as uow:
            job_commands.create_cluster(CLUSTER_SPEC, uow, app.deps)
        assert app.run(ready, timeout_s=20)
        with app.transaction() as uow:
            job_commands.submit_job("demo", spec(150), uow, app.deps, JOB)
        assert app.run(lambda: job().latest_checkpoint is not None, timeout_s=20)
        ballast = fill(small_disk)
        assert app.run(lambda: job().state is not JobState.RUNNING, timeout_s=20, tick_s=0.5)
        waiting = job()
        assert waiting.state is JobState.PENDING, waiting.error  # interrupted, not FAILED
        assert waiting.recovery.storage_full.startswith(str(small_disk)), waiting.recovery
        assert not app.run(lambda: job().state is not JobState.PENDING, timeout_s=2.0,
                           tick_s=0.3)  # still full: it waits, ticks and all
        assert job().attempt == 1 and job().restart_count == 1
        assert app.deps.event_log is not None
        log = [d for d in app.deps.event_log.read() if d["data"].get("job_id") == JOB]
        assert any(d["data"].get("kind") == "job_storage_full" for d in log), \
            [d["type"] for d in log]
        assert any("disk full at" in d["data"].get("reason", "") for d in log)
        saved = job().latest_checkpoint
        assert saved is not None
        os.remove(ballast)  # room again
        assert app.run(lambda: job().terminal, timeout_s=30, tick_s=0.5)
        done = job()
        assert done.state is JobState.SUCCEEDED, done.error
        assert done.attempt == 2 and not done.recovery.storage_full
        resumed = [d for d in app.deps.event_log.read()
                   if d["type"] == "mtc.job.started.v1" and d["data"]["job_id"] == JOB]
        assert resumed[-1]["data"]["resume_step"] >= saved.step
        second = [f for f in app.compute.log_files(JOB) if f.attempt == 2]
        assert any("resumed from step" in Path(f.path).read_text() for f in second)
    finally:
        app.compute.kill_all()
        app.close()
