"""Cluster update (resize, partitions), delete, and job cancel through the real handlers."""

from __future__ import annotations

import copy

import pytest

from services.job_submission import commands as job_commands
from shared.domain.errors import ValidationError
from shared.domain.model import ClusterState, JobState, NodeState
from tests.harness import CLUSTER, Plane, job_body


def ready_plane() -> Plane:
    return Plane().up()


def resized(count: int, spares: int = 1) -> dict[str, object]:
    spec = copy.deepcopy(CLUSTER)
    spec["nodePools"][0].update(nodeCount=count, spareCount=spares)  # type: ignore[index]
    return spec


def cluster_state(plane: Plane) -> ClusterState:
    with plane.uow() as uow:
        cluster = uow.clusters.get("c1")
    assert cluster is not None
    return cluster.state


def test_scale_up_provisions_new_nodes_through_the_same_path() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.update_cluster("c1", resized(6), u, d))
    plane.deliver()
    assert cluster_state(plane) is ClusterState.UPDATING
    assert plane.node("c1-gpu-005").state is NodeState.PROVISIONING
    plane.bring_up()
    assert cluster_state(plane) is ClusterState.READY
    workers = [n for n in plane.nodes("c1") if n.role.value == "worker"]
    assert len(workers) == 6 and all(n.state is NodeState.IDLE for n in workers)
    with plane.uow() as uow:
        partition = uow.partitions.get("c1", "train")
    assert partition is not None and partition.total_nodes == 6


def test_scale_down_retires_idle_nodes_and_drains_busy_ones() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(3), u, d, "j1"))
    plane.deliver()
    busy = set(plane.job("j1").node_ids)
    plane.api(lambda u, d: job_commands.update_cluster("c1", resized(1, 0), u, d))
    plane.deliver()
    states = {n.node_id: n.state for n in plane.nodes("c1") if n.role.value == "worker"}
    assert [s for s in states.values() if s is NodeState.RETIRED] == [NodeState.RETIRED]
    draining = {n for n, s in states.items() if s is NodeState.DRAINING}
    assert draining and draining <= busy and len(draining) == 2
    assert plane.compute.signalled == [("j1", 1)]  # the job checkpoints before nodes leave
    plane.exit_workers("j1", 1, 75)
    states = {n.node_id: n.state for n in plane.nodes("c1") if n.role.value == "worker"}
    assert sorted(s.value for s in states.values()) == ["allocated", "retired", "retired",
                                                        "retired"]
    # three replicas no longer fit one node: the job waits for capacity, like a pending
    # Slurm job, rather than failing (the user may scale up again), and keeps the healthy
    # node it has; cancelling it gives the node back
    job = plane.job("j1")
    assert job.state is JobState.PENDING and job.restart_count == 1
    assert [n for n in job.node_ids if n] == [n for n, s in states.items()
                                              if s is NodeState.ALLOCATED]
    plane.api(lambda u, d: job_commands.cancel_job("j1", u, d))
    plane.deliver()
    assert plane.job("j1").state is JobState.CANCELLED
    assert sorted(n.state.value for n in plane.nodes("c1") if n.role.value == "worker") == [
        "idle", "retired", "retired", "retired"]
    assert cluster_state(plane) is ClusterState.READY
    assert not plane.compute.repairs  # scale-down is not a repair


def test_update_cannot_change_a_pools_machine() -> None:
    plane = ready_plane()
    spec = resized(4)
    spec["nodePools"][0]["machineSpec"]["acceleratorCount"] = 4  # type: ignore[index]
    with pytest.raises(ValidationError) as err:
        plane.api(lambda u, d: job_commands.update_cluster("c1", spec, u, d))
    assert err.value.path == "nodePools[0].machineSpec"
    assert cluster_state(plane) is ClusterState.READY


def test_cancel_signals_then_cancels_and_frees_nodes() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    plane.api(lambda u, d: job_commands.cancel_job("j1", u, d))
    plane.deliver()
    assert plane.job("j1").state is JobState.CANCELLING
    assert plane.compute.signalled == [("j1", 1)]
    plane.exit_workers("j1", 1, 75)
    assert plane.job("j1").state is JobState.CANCELLED
    assert plane.job("j1").restart_count == 0
    assert all(n.state is NodeState.IDLE for n in plane.nodes("c1"))


def test_a_cancel_whose_transaction_is_lost_signals_no_worker() -> None:
    """Found by the stack load test: the cancel signalled the workers before its commit, so
    a cancel that lost a race to another transaction had stopped a job still RUNNING, and
    its workers' exit was judged the program's failure."""
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    with plane.uow() as uow:
        job_commands.cancel_job("j1", uow, plane.deps)
        uow.rollback()  # the commit lost
    plane.deliver()
    assert plane.compute.signalled == []
    assert plane.job("j1").state is JobState.RUNNING
    plane.api(lambda u, d: job_commands.cancel_job("j1", u, d))  # the client's retry
    assert plane.compute.signalled == []  # not before the commit's event is handled
    plane.deliver()
    assert plane.compute.signalled == [("j1", 1)]
    plane.exit_workers("j1", 1, 143)  # SIGTERM, no checkpoint: still a cancel, not a failure
    assert plane.job("j1").state is JobState.CANCELLED


def test_delete_checkpoints_jobs_then_retires_every_node() -> None:
    """Issue: destructive updates. The machines go only after the workers had their SIGTERM
    and grace period to checkpoint, never under a running program."""
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    plane.api(lambda u, d: job_commands.delete_cluster("c1", u, d))
    plane.deliver()
    assert plane.compute.signalled == [("j1", 1)]
    assert plane.job("j1").state is JobState.CANCELLING
    assert cluster_state(plane) is ClusterState.DELETING
    assert not plane.compute.deleted
    plane.exit_workers("j1", 1, 75)
    assert cluster_state(plane) is ClusterState.DELETED
    assert plane.job("j1").state is JobState.CANCELLED
    assert all(n.state is NodeState.RETIRED for n in plane.nodes("c1"))
    assert sorted(plane.compute.deleted) == sorted(n.node_id for n in plane.nodes("c1"))


def test_a_crashing_job_fails_without_restart() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    plane.exit_workers("j1", 1, 1)
    job = plane.job("j1")
    assert job.state is JobState.FAILED and "code 1" in job.error


def test_a_preempted_worker_is_requeued() -> None:
    """75: the program checkpointed on someone's SIGTERM and asks to run again."""
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2 and job.restart_count == 1


@pytest.mark.parametrize("code", [137, -9])
def test_a_kill_nothing_explains_fails_the_job(code: int) -> None:
    """A SIGKILL that neither the control plane nor a node fault caused (the OOM killer, the
    program itself) is the program's failure, not an interruption."""
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    plane.exit_workers("j1", 1, code)
    job = plane.job("j1")
    assert job.state is JobState.FAILED and "SIGKILL" in job.error


def test_a_node_that_cannot_be_had_rolls_the_cluster_back() -> None:
    from shared.domain.events import NodeProvisioned

    plane = Plane()
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()
    plane.inject(NodeProvisioned(node_id="c1-gpu-002", ok=False, detail="quota exceeded"))
    plane.deliver()
    assert cluster_state(plane) is ClusterState.FAILED
    assert all(n.state is NodeState.RETIRED for n in plane.nodes("c1"))  # login node too
    plane.bring_up()  # late answers for retired nodes change nothing
    assert cluster_state(plane) is ClusterState.FAILED


def test_results_that_outrun_their_commit_are_not_lost() -> None:
    """Across processes compute can answer before the asking transaction is visible."""
    from shared.adapters.outbox_bus import MAX_DELIVERY_ATTEMPTS
    from shared.domain.events import JobWorkersExited, NodeProvisioned

    plane = Plane()
    plane.inject(NodeProvisioned(node_id="c1-gpu-000"))  # before the cluster even exists
    plane.deliver()
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()  # creates the node; the early answer was tried first and deferred
    plane.deliver()  # the redelivery finds it
    assert plane.node("c1-gpu-000").state is NodeState.VERIFYING
    plane.bring_up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    # attempt 2's exit, before the commit that starts attempt 2 shows: however long that
    # commit takes (more deliveries than the budget), the exit is held on the job, not lost
    plane.inject(JobWorkersExited(job_id="j1", attempt=2, exit_code=0, detail="early"))
    for _ in range(MAX_DELIVERY_ATTEMPTS + 1):
        plane.deliver()
    assert plane.job("j1").state is JobState.RUNNING and plane.job("j1").attempt == 1
    assert plane.job("j1").recovery.early_exit == (2, 0, "early", "", "")  # (no full disk, no launch failure)
    assert plane.deps.dead_letters.list() == []  # type: ignore[attr-defined]
    plane.exit_workers("j1", 1, 75)  # attempt 2 starts; its start announces the held exit
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.SUCCEEDED and job.attempt == 2, job
    assert job.recovery.early_exit is None


def test_an_early_exit_of_a_job_that_ended_is_dropped() -> None:
    """A job that ended before the start an early exit answers: nothing is held."""
    from shared.domain.events import JobWorkersExited

    plane = Plane().up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.exit_workers("j1", 1, 1)  # the program's own failure: FAILED
    assert plane.job("j1").state is JobState.FAILED
    plane.exit_workers("j1", 2, 0)
    assert plane.job("j1").state is JobState.FAILED
    assert plane.job("j1").recovery.early_exit is None
    plane.inject(JobWorkersExited(job_id="j1", attempt=1, exit_code=0))  # stale: ignored
    plane.deliver()
    assert plane.job("j1").state is JobState.FAILED


def test_an_answer_for_a_node_that_never_exists_is_dead_lettered() -> None:
    from shared.adapters.outbox_bus import MAX_DELIVERY_ATTEMPTS
    from shared.domain.events import NodeProvisioned

    plane = Plane()
    plane.inject(NodeProvisioned(node_id="ghost"))
    for _ in range(MAX_DELIVERY_ATTEMPTS):
        plane.deliver()
    dead = plane.deps.dead_letters.list()  # type: ignore[attr-defined]
    assert [d["subject"] for d in dead] == ["ghost"]
    assert plane.bus.outbox.pending() == []
