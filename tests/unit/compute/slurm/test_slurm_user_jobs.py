"""SlurmCompute and the jobs users submit with plain sbatch (slurm_userjobs), against the
in-memory Slurm: which jobs are adopted, once each; SIGTERM, then scontrol requeue; how each
run ends; checkpoints from the job's comment; the bound on what is tracked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shared.adapters.compute.slurm import userjobs as slurm_userjobs
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import JobAdopted, JobCheckpointSaved, JobWorkersExited

from .fake_slurm import FakeSlurm
from .test_slurm_compute import Clock, Events, clock, events, make, provisioned, slurm

__all__ = ["clock", "events", "make", "slurm"]  # fixtures shared with test_slurm_compute
Make = Callable[..., SlurmCompute]


def ready(make: Make) -> tuple[SlurmCompute, dict[str, str]]:
    compute = make()
    mapping = provisioned(compute, "w1", "w2", "w3")
    return compute, {v: k for k, v in mapping.items()}


def test_a_users_running_job_in_mtcs_partition_is_adopted_once(
        make: Make, slurm: FakeSlurm, events: Events) -> None:
    compute, node_of = ready(make)
    job = slurm.user_job(["n1"])
    compute.poll()
    compute.poll()
    (adopted,) = events.of(JobAdopted)
    assert adopted.job_id == f"slurm-{job.job_id}" and adopted.attempt == 1
    assert adopted.node_ids == (node_of["n1"],) and adopted.slurm_job_id == job.job_id
    assert adopted.user == "alice" and adopted.partition == "mtc"


@pytest.mark.parametrize("kind", ["mtc-name", "other-partition", "no-requeue", "pending", "unmapped"])
def test_jobs_that_are_not_a_users_own_in_a_managed_partition_are_left_alone(
        make: Make, slurm: FakeSlurm, events: Events, kind: str) -> None:
    compute, _ = ready(make)
    if kind == "mtc-name":
        slurm.user_job(["n1"], name="mtc-job-1-a1-abc")
    elif kind == "other-partition":
        slurm.user_job(["n1"], partition="main")
    elif kind == "no-requeue":
        slurm.user_job(["n1"], requeue=False)
    elif kind == "pending":
        slurm.user_job([], state="PENDING")
    else:
        slurm.user_job(["n4"])  # a Slurm node no mtc node is mapped to
    compute.poll()
    assert events.of(JobAdopted) == []


def test_signal_then_requeue_after_the_grace_and_the_rerun_is_the_next_attempt(
        make: Make, slurm: FakeSlurm, events: Events, clock: Clock) -> None:
    compute, node_of = ready(make)
    job = slurm.user_job(["n1"])
    compute.poll()
    job_id = f"slurm-{job.job_id}"
    compute.signal_workers(job_id, 1, 30.0)
    assert ("signal", str(job.job_id), "TERM") in slurm.calls
    compute.poll()
    assert slurm.count("requeue") == 0  # still in its grace period
    clock.advance(31)
    compute.poll()
    assert slurm.count("requeue") == 1 and slurm.count("cancel") == 0  # requeued, never cancelled
    compute.poll()
    (ended,) = events.of(JobWorkersExited)
    assert (ended.job_id, ended.attempt, ended.exit_code) == (job_id, 1, 137)
    assert "requeued by mtc" in ended.detail
    job.state, job.nodes = "RUNNING", ("n2",)  # Slurm runs it again elsewhere
    compute.poll()
    second = events.of(JobAdopted)[-1]
    assert (second.attempt, second.node_ids) == (2, (node_of["n2"],))
    compute.poll()
    assert slurm.count("requeue") == 1 and len(events.of(JobAdopted)) == 2


def test_a_program_that_checkpointed_and_exited_is_requeued_at_once_with_its_code(
        make: Make, slurm: FakeSlurm, events: Events) -> None:
    compute, _ = ready(make)
    job = slurm.user_job(["n1"])
    compute.poll()
    compute.signal_workers(f"slurm-{job.job_id}", 1, 300.0)
    job.state, job.exit_code = "FAILED", 75 << 8  # it exited 75 on SIGTERM
    compute.poll()
    assert slurm.count("requeue") == 1 and slurm.count("start_now") == 1
    compute.poll()
    (ended,) = events.of(JobWorkersExited)
    assert ended.exit_code == 75  # as recorded before the requeue cleared it


@pytest.mark.parametrize(("state", "wait_status", "code"), [
    ("COMPLETED", 0, 0), ("FAILED", 1 << 8, 1), ("CANCELLED", 15, 143)])
def test_a_run_that_ends_without_mtc_reports_its_exit(
        make: Make, slurm: FakeSlurm, events: Events, state: str, wait_status: int, code: int) -> None:
    compute, _ = ready(make)
    job = slurm.user_job(["n1"])
    compute.poll()
    job.state, job.exit_code = state, wait_status
    compute.poll()
    (ended,) = events.of(JobWorkersExited)
    assert ended.exit_code == code and state in ended.detail
    assert slurm.count("requeue") == 0


def test_a_requeue_by_slurm_itself_asks_to_resume(make: Make, slurm: FakeSlurm, events: Events) -> None:
    compute, _ = ready(make)
    job = slurm.user_job(["n1"])
    compute.poll()
    job.state, job.restart_cnt, job.nodes = "PENDING", 1, ()  # node failure: Slurm requeued it
    compute.poll()
    (ended,) = events.of(JobWorkersExited)
    assert ended.exit_code == 75 and "requeued by Slurm itself" in ended.detail


def test_gone_from_squeue_is_killed_after_the_settle_time(
        make: Make, slurm: FakeSlurm, events: Events, clock: Clock) -> None:
    compute, _ = ready(make)
    job = slurm.user_job(["n1"])
    compute.poll()
    del slurm.queue[job.job_id]
    compute.poll()
    assert events.of(JobWorkersExited) == []
    clock.advance(2)
    compute.poll()
    assert events.of(JobWorkersExited)[0].exit_code == 137


def test_checkpoints_in_the_commented_dir_are_reported_once(
        make: Make, slurm: FakeSlurm, events: Events, tmp_path: Path) -> None:
    compute, _ = ready(make)
    work = tmp_path / "alice"
    (work / "ck").mkdir(parents=True)
    job = slurm.user_job(["n1"], comment="mtc:checkpoint-dir=ck", work_dir=str(work))
    compute.poll()
    assert events.of(JobAdopted)[0].checkpoint_dir == str((work / "ck").resolve())
    (work / "ck" / "ckpt-00000020.pt").write_bytes(b"x")
    compute.poll()
    compute.poll()
    (saved,) = events.of(JobCheckpointSaved)
    assert (saved.job_id, saved.attempt, saved.step) == (f"slurm-{job.job_id}", 1, 20)


def test_what_is_tracked_is_bounded_with_an_alert(
        make: Make, slurm: FakeSlurm, events: Events, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_userjobs, "MAX_USER_JOBS", 2)
    compute, _ = ready(make)
    for node in ("n1", "n2", "n3"):
        slurm.user_job([node])
    compute.poll()
    assert len(events.of(JobAdopted)) == 2
    assert [a.kind for a in compute.alerts()] == ["user-jobs-limit"]


def test_no_managed_partitions_adopts_nothing(make: Make, slurm: FakeSlurm, events: Events) -> None:
    compute = make(user_job_partitions=())
    provisioned(compute, "w1")
    slurm.user_job(["n1"])
    compute.poll()
    assert events.of(JobAdopted) == []


def test_a_restarted_adapter_does_not_adopt_or_requeue_again(
        make: Make, slurm: FakeSlurm, events: Events, clock: Clock) -> None:
    compute, _ = ready(make)
    job = slurm.user_job(["n1"])
    compute.poll()
    compute.signal_workers(f"slurm-{job.job_id}", 1, 5.0)
    clock.advance(6)
    compute.poll()
    compute.close()
    again = make()  # same state dir: what was adopted and asked is remembered
    again.poll()
    again.poll()
    assert len(events.of(JobAdopted)) == 1 and slurm.count("requeue") == 1
    assert slurm.count("signal") == 1
