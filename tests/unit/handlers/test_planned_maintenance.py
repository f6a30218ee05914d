"""Planned maintenance becomes a checkpoint-and-move before it happens: the compute adapter's
UpcomingMaintenance report (Compute Engine's resourceStatus.upcomingMaintenance) goes through
the real triage, drain, checkpoint-resume and repair handlers on the in-memory plane."""

from __future__ import annotations

from typing import Any

from services.job_submission import commands as job_commands
from shared.domain.health import COMPUTE_SOURCE, RepairAction
from shared.domain.model import JobState, NodeState
from tests.harness import Plane, healthy, job_body


def maintenance(at: float, status: str = "true") -> tuple[dict[str, Any], ...]:
    return ({"type": "UpcomingMaintenance", "status": status, "since": at,
             "reason": "SCHEDULED maintenance pending from 2026-12-02T03:00:00Z",
             "details": {"window_start": "2026-12-02T03:00:00Z"}},)


def test_upcoming_maintenance_drains_checkpoints_moves_the_job_and_reboots_the_node() -> None:
    plane = Plane().up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    node = plane.job("j1").node_ids[0]
    heard = plane.node(node).last_report_at

    plane.clock.advance(5)
    plane.report(node, maintenance(plane.clock.now()), source=COMPUTE_SOURCE)
    plane.deliver()
    assert plane.node(node).state is NodeState.DRAINING
    assert plane.node(node).last_report_at == heard  # the cloud's notice is no heartbeat
    assert plane.compute.signalled == [("j1", 1)]  # checkpoint now, before the window
    assert node in plane.compute.cordoned

    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2 and node not in job.node_ids
    assert plane.compute.repairs == [(node, RepairAction.REBOOT, 1)]  # stop/start: a new host

    plane.finish_repairs()
    for _ in range(plane.deps.config.repair.return_after_passes):
        plane.clock.advance(1)
        plane.report(node, maintenance(plane.clock.now(), "false"), source="post-repair-check")
        plane.report(node, healthy(plane.clock.now()))
        plane.deliver()
    assert plane.node(node).state is NodeState.IDLE
