"""Jobs users submit with plain sbatch, adopted through the real handlers (in-memory plane):
adoption allocates the nodes, a fault signals the job, the requeued run is the next attempt
on the nodes Slurm chose, scheduling never places it, and duplicates or stale runs change
nothing."""

from __future__ import annotations

import pytest

from services.job_submission import commands as job_commands
from shared.domain.adopted import adopted, adopted_spec
from shared.domain.errors import ValidationError
from shared.domain.events import JobAdopted
from shared.domain.model import JobState, NodeState
from tests.harness import Plane, job_body, xid


def ready_plane() -> Plane:
    return Plane().up()


def adopt(plane: Plane, attempt: int, *node_ids: str) -> None:
    plane.inject(JobAdopted(job_id="slurm-7", attempt=attempt, node_ids=node_ids, slurm_job_id=7,
                            name="train", user="Alice", partition="mtc", command="/home/a/job.sh"))
    plane.deliver()


def test_adopted_job_is_healed_like_any_job_and_slurm_places_its_rerun() -> None:
    plane = ready_plane()
    adopt(plane, 1, "c1-gpu-000")
    job = plane.job("slurm-7")
    assert adopted(job.spec) and job.state is JobState.RUNNING and job.attempt == 1
    assert dict(job.spec.labels) == {"mtc-origin": "slurm", "mtc-slurm-job-id": "7",
                                     "mtc-slurm-user": "alice"}
    assert plane.node("c1-gpu-000").state is NodeState.ALLOCATED
    assert plane.compute.started == []  # mtc started nothing: Slurm runs it

    plane.clock.advance(5)
    plane.report("c1-gpu-000", xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.compute.signalled == [("slurm-7", 1)]
    plane.exit_workers("slurm-7", 1, 75)
    job = plane.job("slurm-7")
    assert job.state is JobState.PENDING and job.restart_count == 1
    assert plane.compute.started == []  # scheduling leaves it to Slurm

    adopt(plane, 2, "c1-gpu-001")  # Slurm ran it again on another node
    job = plane.job("slurm-7")
    assert job.state is JobState.RUNNING and job.attempt == 2 and job.node_ids == ("c1-gpu-001",)
    assert plane.node("c1-gpu-001").state is NodeState.ALLOCATED
    adopt(plane, 2, "c1-gpu-001")  # a duplicate
    adopt(plane, 1, "c1-gpu-002")  # a stale run
    assert plane.job("slurm-7").attempt == 2 and plane.node("c1-gpu-002").state is NodeState.IDLE

    plane.exit_workers("slurm-7", 2, 0)
    assert plane.job("slurm-7").state is JobState.SUCCEEDED
    assert plane.node("c1-gpu-001").state is NodeState.IDLE


def test_a_rerun_before_the_previous_exit_is_retried_not_lost() -> None:
    plane = ready_plane()
    adopt(plane, 1, "c1-gpu-000")
    adopt(plane, 2, "c1-gpu-001")  # attempt 1's exit has not been handled yet
    assert plane.job("slurm-7").attempt == 1
    plane.exit_workers("slurm-7", 1, 75)  # PREEMPTED: "requeued by Slurm itself"
    plane.clock.advance(60)
    plane.deliver()  # the retried adoption now starts attempt 2
    job = plane.job("slurm-7")
    assert job.state is JobState.RUNNING and job.attempt == 2, job


def test_api_jobs_may_not_claim_the_origin() -> None:
    plane = ready_plane()
    body = job_body(1) | {"labels": {"mtc-origin": "slurm"}}
    with pytest.raises(ValidationError, match=r"labels\.mtc-origin"):
        plane.api(lambda u, d: job_commands.submit_job("c1", body, u, d, "j1"))


def test_what_slurm_says_about_a_job_cannot_make_its_adoption_fail() -> None:
    spec = adopted_spec(name="   ", slurm_job_id=9, user="Üser Name!", command=" ",
                        machine_type="a3-highgpu-8g", replicas=0)
    assert spec.display_name == "slurm-9" and spec.replica_count == 1
    assert dict(spec.labels)["mtc-slurm-user"] == "-ser-name-"
    assert spec.worker_pool_specs[0].container_spec is not None
    assert spec.worker_pool_specs[0].container_spec.command == ()
