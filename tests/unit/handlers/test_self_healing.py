"""The self-healing story through the real handlers on the in-memory plane."""

from __future__ import annotations

from services.job_submission import commands as job_commands
from shared.domain.health import RepairAction
from shared.domain.model import ClusterState, JobState, NodeState
from tests.harness import Plane, healthy, job_body, xid


def ready_plane() -> Plane:
    return Plane().up()


def test_cluster_comes_up_with_login_workers_and_a_spare() -> None:
    plane = ready_plane()
    nodes = plane.nodes("c1")
    assert [n.node_id for n in nodes] == ["c1-gpu-000", "c1-gpu-001", "c1-gpu-002",
                                          "c1-gpu-003", "c1-login"]
    assert all(n.state is NodeState.IDLE for n in nodes)
    assert [n.node_id for n in nodes if n.is_spare] == ["c1-gpu-003"]
    with plane.uow() as uow:
        cluster = uow.clusters.get("c1")
    assert cluster is not None and cluster.state is ClusterState.READY


def test_xid79_drains_checkpoints_requeues_on_spare_and_repairs() -> None:
    plane = ready_plane()
    job = plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 1
    bad, good = job.node_ids
    assert "c1-gpu-003" not in job.node_ids  # fresh jobs leave the spare alone

    plane.clock.advance(5)
    plane.report(bad, xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node(bad).state is NodeState.DRAINING
    assert plane.compute.signalled == [("j1", 1)]
    assert plane.compute.cordoned == {bad}

    plane.exit_workers("j1", 1, 75)  # checkpointed on SIGTERM
    job = plane.job("j1")
    assert job.restart_count == 1 and job.state is JobState.RUNNING and job.attempt == 2
    assert bad not in job.node_ids and good in job.node_ids
    assert "c1-gpu-003" in job.node_ids  # the resumed job took the spare
    assert plane.node(bad).state is NodeState.REPAIRING
    assert plane.compute.repairs == [(bad, RepairAction.REBOOT, 1)]

    plane.finish_repairs()
    assert plane.node(bad).state is NodeState.VERIFYING
    for _ in range(2):
        plane.clock.advance(1)
        plane.report(bad, healthy(plane.clock.now()))
        plane.deliver()
    assert plane.node(bad).state is NodeState.IDLE
    assert plane.compute.cordoned == set()

    plane.exit_workers("j1", 2, 0)
    assert plane.job("j1").state is JobState.SUCCEEDED
    assert all(n.state is NodeState.IDLE for n in plane.nodes("c1"))


def test_duplicate_report_changes_nothing() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    bad = plane.job("j1").node_ids[0]
    env = plane.report(bad, xid(79, plane.clock.now()))
    plane.deliver()
    before = plane.store.snapshot()["nodes"]
    plane.bus.inject(env)
    plane.deliver()
    assert plane.store.snapshot()["nodes"] == before
    assert plane.compute.signalled == [("j1", 1)]


def test_failed_post_repair_check_climbs_the_ladder() -> None:
    plane = ready_plane()
    node = "c1-gpu-001"
    plane.report(node, xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.compute.repairs == [(node, RepairAction.REBOOT, 1)]
    plane.finish_repairs()
    plane.clock.advance(2)
    plane.report(node, xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node(node).state is NodeState.REPAIRING
    assert plane.compute.repairs == [(node, RepairAction.REIMAGE, 2)]


def test_stale_repair_result_is_ignored() -> None:
    plane = ready_plane()
    node = "c1-gpu-001"
    plane.report(node, xid(79, plane.clock.now()))
    plane.deliver()
    from shared.domain.events import NodeRepairCompleted

    plane.inject(NodeRepairCompleted(node_id=node, action="reboot", attempt=7, ok=True))
    plane.deliver()
    assert plane.node(node).state is NodeState.REPAIRING


def test_a_repair_result_that_outruns_its_start_is_held_and_applied() -> None:
    """Compute answers from outside the transaction that started the repair: attempt 2's
    result can come before attempt 2 is recorded. Held on the node however long that commit
    takes, it is announced again by the start, not redelivered until it is dead-lettered."""
    from shared.adapters.outbox_bus import MAX_DELIVERY_ATTEMPTS
    from shared.domain.events import NodeRepairCompleted

    plane = ready_plane()
    node = "c1-gpu-001"
    plane.report(node, xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.compute.repairs == [(node, RepairAction.REBOOT, 1)]
    plane.inject(NodeRepairCompleted(node_id=node, action="reimage", attempt=2, ok=True))
    for _ in range(MAX_DELIVERY_ATTEMPTS + 1):
        plane.deliver()
    assert plane.node(node).state is NodeState.REPAIRING
    assert list(plane.node(node).early_repair or ()) == [2, "reimage", True, ""]
    assert plane.deps.dead_letters.list() == []  # type: ignore[attr-defined]
    plane.finish_repairs(ok=False)  # the reboot failed: the ladder starts attempt 2, reimage
    assert plane.compute.repairs == [(node, RepairAction.REIMAGE, 2)]
    assert plane.node(node).state is NodeState.VERIFYING  # its held result applied
    assert plane.node(node).early_repair is None


def test_slow_node_acts_only_when_confirmed() -> None:
    from shared.domain.health import Condition, ConditionStatus, ConditionType

    plane = ready_plane()
    node = "c1-gpu-002"
    slow = (Condition(ConditionType.SLOW_SPEED_CHECK.value, ConditionStatus.TRUE, "0.7x",
                      plane.clock.now(), {"ratio_to_baseline": 0.7}).to_dict(),)
    plane.report(node, slow)
    plane.deliver()
    assert plane.node(node).state is NodeState.IDLE  # one slow run could be noise
    plane.clock.advance(60)
    plane.report(node, slow)
    plane.deliver()
    assert plane.node(node).state is NodeState.REPAIRING
    assert plane.compute.repairs == [(node, RepairAction.REBOOT, 1)]


def test_blast_radius_guard_holds_the_second_node() -> None:
    plane = ready_plane()  # 4 workers, 25%: one node may be out at a time
    plane.report("c1-gpu-000", xid(79, plane.clock.now()))
    plane.report("c1-gpu-001", xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node("c1-gpu-000").state is NodeState.REPAIRING
    assert plane.node("c1-gpu-001").state is NodeState.SUSPECT
    held = [e for e in plane.delivered if e.type == "mtc.node.repair_held.v1"]
    assert [e.event.subject for e in held] == ["c1-gpu-001"]


def test_readme_four_node_cluster_heals_its_second_and_third_fault() -> None:
    """README's cluster (4 GPU nodes, one a spare) held the 2nd and 3rd
    XID 79 of the hour (the removal limit was one node per partition per hour), so a node
    whose GPU fell off the bus kept its job while the cluster read READY."""
    plane = ready_plane()
    for node in ("c1-gpu-000", "c1-gpu-001", "c1-gpu-002"):
        plane.clock.advance(60)
        plane.report(node, xid(79, plane.clock.now()))
        plane.deliver()
        assert plane.node(node).state is NodeState.REPAIRING, node
        plane.finish_repairs()
        for _ in range(2):
            plane.clock.advance(1)
            plane.report(node, healthy(plane.clock.now()))
            plane.deliver()
        assert plane.node(node).state is NodeState.IDLE, node
    assert not [e for e in plane.delivered if e.type == "mtc.node.repair_held.v1"]
    # The whole partition cycling through repair within the hour is what a shared cause
    # looks like: the 4th removal of the hour is held.
    plane.clock.advance(60)
    plane.report("c1-gpu-003", xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node("c1-gpu-003").state is NodeState.SUSPECT


def test_unmapped_xid_restarts_the_job_but_keeps_the_node() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    node = plane.job("j1").node_ids[0]
    plane.report(node, xid(999, plane.clock.now()))
    plane.deliver()
    assert plane.node(node).state is NodeState.ALLOCATED
    assert plane.compute.signalled == [("j1", 1)]
    diagnosed = [e for e in plane.delivered if e.type == "mtc.node.diagnosed.v1"]
    assert diagnosed[-1].event.unmapped_xids == (999,)
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.restart_count == 1 and node in job.node_ids


def test_manual_xid_drains_and_holds_the_node_for_a_person() -> None:
    plane = ready_plane()
    node = "c1-gpu-002"
    plane.report(node, xid(54, plane.clock.now()))  # "check mechanicals"
    plane.deliver()
    assert plane.node(node).state is NodeState.FAILED
    assert plane.node(node).reason.startswith("needs a person")
    assert plane.compute.repairs == []
    assert any(e.type == "mtc.node.repair_held.v1" for e in plane.delivered)


def test_a_failed_repair_escalates_to_the_next_rung() -> None:
    plane = ready_plane()
    node = "c1-gpu-001"
    plane.report(node, xid(79, plane.clock.now()))
    plane.deliver()
    plane.finish_repairs(ok=False)
    assert plane.node(node).state is NodeState.REPAIRING
    assert plane.compute.repairs == [(node, RepairAction.REIMAGE, 2)]
    plane.finish_repairs(ok=False)
    assert plane.node(node).state is NodeState.RETIRED  # reimage failed too: replace
    assert plane.node("c1-gpu-001-r1").state is NodeState.PROVISIONING
    assert "c1-gpu-001-r1" in plane.compute.provisioned and node in plane.compute.deleted


def test_only_the_failed_node_is_replaced_and_ranks_are_kept() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(3), u, d, "j1"))
    plane.deliver()
    first = plane.job("j1").node_ids
    plane.report(first[1], xid(79, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.attempt == 2
    assert job.node_ids[0] == first[0] and job.node_ids[2] == first[2]  # kept, same ranks
    assert job.node_ids[1] == "c1-gpu-003"  # the hole went to the spare
    ranks = {w.rank: w.node_id for w in plane.compute.started if w.attempt == 2}
    assert ranks == dict(enumerate(job.node_ids))


def test_a_preempted_program_restarts_on_the_same_nodes() -> None:
    plane = ready_plane()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    first = plane.job("j1").node_ids
    plane.exit_workers("j1", 1, 75)  # no node lost
    job = plane.job("j1")
    assert (job.state, job.attempt, job.node_ids) == (JobState.RUNNING, 2, first)
