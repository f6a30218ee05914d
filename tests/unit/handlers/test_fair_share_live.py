"""Fair share on the real handlers (stepped clock): team a borrows team b's idle quota and
gives it back by preemption when b submits: a's job is signalled, checkpoints, is requeued
with all its nodes given back, and its lost time is counted under the cause ``preemption``;
b's job runs on the reclaimed nodes; each waiting job shows its queue, position and reason."""

from __future__ import annotations

from typing import Any

from services.console import views as console_views
from services.job_submission import commands as job_commands
from shared.domain.events import FleetTicked
from shared.domain.model import JobState, NodeState
from shared.goodput import JobAccounting
from shared.goodput.live import job_accounting
from tests.harness import Plane, healthy, job_body, xid

QUEUED_CLUSTER: dict[str, Any] = {
    "clusterId": "c1",
    "nodePools": [{"id": "gpu", "nodeCount": 4,
                   "machineSpec": {"machineType": "a3-highgpu-8g",
                                   "acceleratorType": "NVIDIA_H100_80GB",
                                   "acceleratorCount": 8}}],
    "partitions": [{"name": "train", "nodePoolIds": ["gpu"]}],
    "queues": [{"team": "a", "partition": "train", "nominalNodes": 2},
               {"team": "b", "partition": "train", "nominalNodes": 2}],
}


def team_job(team: str, replicas: int) -> dict[str, Any]:
    body = job_body(replicas)
    body["labels"] = {"mtc-team": team}
    return body


def submit(plane: Plane, job_id: str, team: str, replicas: int) -> None:
    plane.api(lambda u, d: job_commands.submit_job("c1", team_job(team, replicas), u, d, job_id))
    plane.deliver()


def test_a_borrows_b_idle_quota_and_gives_it_back_by_preemption() -> None:
    plane = Plane().up(QUEUED_CLUSTER)
    submit(plane, "ja", "a", 4)  # b is idle: a borrows its two nodes
    ja = plane.job("ja")
    assert ja.state is JobState.RUNNING and len(ja.node_ids) == 4
    plane.clock.advance(60)
    plane.compute.checkpoint("ja", 1, 100)
    plane.deliver()

    plane.clock.advance(30)
    submit(plane, "jb", "b", 2)  # b reclaims: a's borrowing job is preempted
    assert plane.compute.signalled == [("ja", 1)]
    assert plane.job("ja").interrupt_reason.startswith("preemption: team b reclaims")
    jb = plane.job("jb")
    assert jb.state is JobState.PENDING
    assert jb.queue["position"] == 1 and jb.queue["reason"].startswith("reclaiming quota")
    shown = console_views.job_row(jb, JobAccounting(0.0, 0.0, 0, 0), None)["queue"]
    assert shown == jb.queue  # the console's job page shows the same

    plane.clock.advance(10)
    plane.exit_workers("ja", 1, 75)  # checkpointed on SIGTERM
    ja, jb = plane.job("ja"), plane.job("jb")
    assert jb.state is JobState.RUNNING and len(jb.node_ids) == 2
    assert ja.state is JobState.PENDING and ja.restart_count == 1 and ja.error == ""
    assert not any(ja.node_ids)  # every node given back, none kept to restart in place
    assert ja.queue["team"] == "a" and ja.queue["reason"].startswith("waiting to borrow")
    assert {n.job_id for n in plane.nodes("c1") if n.job_id} == {"jb"}

    rows = [{"type": e.type, "time": e.time, "data": e.event.to_dict()}
            for e in plane.delivered]
    acc = job_accounting(rows, "ja", now=plane.clock.now(), nodes=4)
    assert acc.goodput is not None
    causes = acc.goodput.by_cause()
    assert causes.get("preemption", 0.0) > 0.0
    assert not any(c.startswith("exit_code") for c in causes)  # not the program's failure

    plane.clock.advance(100)
    plane.exit_workers("jb", 1, 0)  # b's job ends: at the next tick a borrows again
    for node in plane.nodes("c1"):  # (the nodes' agents keep reporting: no stale heartbeat)
        plane.report(node.node_id, healthy(plane.clock.now()))
    plane.deliver()
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()
    ja = plane.job("ja")
    assert ja.state is JobState.RUNNING and ja.attempt == 2 and ja.queue is None


def test_a_team_within_its_quota_is_not_preempted() -> None:
    plane = Plane().up(QUEUED_CLUSTER)
    submit(plane, "ja", "a", 2)
    submit(plane, "jb", "b", 2)
    submit(plane, "jb2", "b", 1)  # b is at its quota, a within its own: no preemption
    assert plane.compute.signalled == []
    jb2 = plane.job("jb2")
    assert jb2.state is JobState.PENDING
    assert jb2.queue["position"] == 1 and "borrow" in jb2.queue["reason"]


def test_without_queues_nothing_is_preempted_and_no_queue_is_shown() -> None:
    plane = Plane().up({k: v for k, v in QUEUED_CLUSTER.items() if k != "queues"})
    submit(plane, "ja", "a", 4)
    submit(plane, "jb", "b", 2)
    assert plane.compute.signalled == []
    assert plane.job("jb").state is JobState.PENDING and plane.job("jb").queue is None


def test_a_node_in_repair_is_no_capacity_so_a_team_reclaims_instead_of_waiting() -> None:
    plane = Plane().up(QUEUED_CLUSTER)
    submit(plane, "ja", "a", 3)  # a borrows one of b's nodes
    (idle,) = [n.node_id for n in plane.nodes("c1") if n.role.value == "worker" and not n.job_id]
    plane.clock.advance(5)
    plane.report(idle, xid(79, plane.clock.now()))  # the last idle node goes for repair
    plane.deliver()
    assert plane.node(idle).state is not NodeState.IDLE
    submit(plane, "jb", "b", 1)  # within b's quota, and nothing idle: a gives back
    assert plane.compute.signalled == [("ja", 1)]
    assert plane.job("jb").queue["reason"].startswith("reclaiming quota")
