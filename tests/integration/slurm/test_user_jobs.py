"""A job a user submits with plain ``sbatch --requeue`` survives a node fault with its checkpoint.

The control plane (``embedded(..., compute="slurm")``) runs over the session's real Slurm
cluster (conftest.py). The user's job is examples/slurm_user_job.sh, submitted with ``sbatch``
as a user on the login node would; mtc did not submit it. An XID on its node: the node is
drained in Slurm, the job gets SIGTERM (``scancel --signal=TERM``), checkpoints and exits,
is requeued (``scontrol requeue``) and runs again on another node, resuming from the
checkpoint; mtc's job view and goodput show the restart and the (absent) lost work.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from services.api.custom_jobs import adopted_record, render
from services.api.names import Parent
from services.cli.demo_slurm import cluster_spec
from services.wiring.embedded import EmbeddedApp
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.adopted import adopted
from shared.domain.model import JobState, NodeState
from shared.goodput import job_accounting

from .conftest import Cluster, timing
from .test_e2e_selfheal import Recorder, create, get_job, make_app, node_state, run_until

__all__ = ["make_app"]  # the fixture, shared with the self-healing tests
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "slurm_user_job.sh"
STEPS = 160


def sbatch(cluster: Cluster, workdir: Path, *args: str) -> int:
    """Submit as a user would: plain sbatch of the example script, no mtc involved."""
    env = dict(cluster.env, SLURM_CONF=cluster.slurm_conf, PYTHON=sys.executable,
               TRAIN_SCRIPT=str(REPO / "examples" / "train.py"))
    out = subprocess.run(
        ["sbatch", "--parsable", "--requeue", f"--output={workdir / 'job.out'}", str(SCRIPT), *args],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    return int(out.strip().split(";")[0])


def test_plain_sbatch_job_checkpoints_requeues_and_resumes_on_another_node(
    cluster: Cluster, make_app: Callable[..., EmbeddedApp], tmp_path: Path
) -> None:
    app = make_app()
    compute: SlurmCompute = app.compute
    rec = Recorder(cluster.slurm)
    app.bus.listeners.append(rec)
    create(app, cluster_spec("it-user"))
    by_slurm = {v: k for k, v in compute.mapping().items()}
    run_until(app, "n1-n4 in service in Slurm", lambda: all(  # else Slurm may power up c1
        not n.drained and n.available for n in cluster.slurm.nodes() if n.name in by_slurm), 30)
    workdir = tmp_path / "user"
    workdir.mkdir()
    slurm_id = sbatch(cluster, workdir, "--steps", str(STEPS), "--checkpoint-every", "20",
                      "--step-time", "0.05")
    job_id = f"slurm-{slurm_id}"

    def adopted_with_checkpoint() -> bool:
        with app.transaction() as uow:
            job = uow.jobs.get(job_id)
        return job is not None and job.latest_checkpoint is not None

    try:
        run_until(app, "the user's job adopted, with a checkpoint", adopted_with_checkpoint, 60)
    except BaseException:
        print(cluster.slurm.jobs(), compute.mapping(), (workdir / "job.out").read_text()[-3000:])
        raise
    first = get_job(app, job_id)
    assert adopted(first.spec) and first.state is JobState.RUNNING and first.attempt == 1
    labels = dict(first.spec.labels)
    assert labels["mtc-origin"] == "slurm" and labels["mtc-slurm-job-id"] == str(slurm_id)
    (victim,) = first.node_ids
    bad = compute.mapping()[victim]
    assert cluster.slurm.job(slurm_id).node_list == (bad,)
    assert node_state(app, victim) is NodeState.ALLOCATED  # mtc knows the node is busy with it

    rec.watch = {"mtc.job.signalled.v1": bad}
    injected = time.monotonic()
    compute.inject_xid(victim, 79)
    run_until(app, "the first run to end", lambda: bool(rec.of("job.workers_exited.v1")), 90)
    timing("XID to the user's job checkpointed and requeued", time.monotonic() - injected)
    assert rec.snapshots["mtc.job.signalled.v1"].drained  # drained in Slurm before the SIGTERM
    exited = rec.of("job.workers_exited.v1")[0]
    assert exited["attempt"] == 1 and exited["exit_code"] == 75, exited  # checkpointed on SIGTERM
    assert "requeued by mtc" in exited["detail"], exited

    run_until(app, "the job to finish", lambda: get_job(app, job_id).terminal, 120)
    timing("XID to the user's job done", time.monotonic() - injected)
    final = get_job(app, job_id)
    assert final.state is JobState.SUCCEEDED, final.error
    assert final.restart_count == 1 and final.attempt == 2
    started = rec.of("job.started.v1")
    started = [s for s in started if s["job_id"] == job_id]
    assert [s["attempt"] for s in started] == [1, 2]
    (second_node,) = started[1]["node_ids"]
    assert second_node != victim and compute.mapping()[second_node] != bad  # rerun elsewhere
    saved = max(c["step"] for c in rec.of("job.checkpoint_saved.v1")
                if c["job_id"] == job_id and c["attempt"] == 1)
    assert started[1]["resume_step"] == saved > 0

    out = (workdir / "job.out").read_text()
    assert re.findall(r"run (\d+) of Slurm job", out) == ["1", "2"], out[-2000:]
    assert re.findall(r"resumed from step (\d+)", out) == [str(saved)], out[-2000:]
    assert f"done at step {STEPS}" in out
    restarts = cluster.slurm.job(slurm_id).restart_cnt
    assert restarts == 1  # one scontrol requeue

    docs = list(app.deps.event_log.read()) if app.deps.event_log else []
    acct = job_accounting(docs, job_id)
    assert acct.restarts == 1 and acct.lost_steps == 0, acct  # checkpointed at SIGTERM: none lost
    assert 0 < acct.recovery_s < acct.wall_s
    view = render(final, Parent("p", "l"), job_id, adopted_record(final))  # the CustomJob view
    assert view["labels"]["mtc-origin"] == "slurm" and view["state"] == "JOB_STATE_SUCCEEDED"
    assert view["mtcProgress"]["restartCount"] == 1 and view["mtcProgress"]["attempt"] == 2
    assert int(view["mtcProgress"]["latestCheckpoint"]["step"]) >= saved
    assert by_slurm[bad] == victim
    run_until(app, "the node back in service", lambda: node_state(app, victim) is NodeState.IDLE, 90)
