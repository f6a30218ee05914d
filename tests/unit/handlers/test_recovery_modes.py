"""Recovery modes through the real handlers on the in-memory plane.

A job that measured tier-1 (memory) and tier-2 (peer) saves restarts in place after a
RESTART_JOB-class fault and hot-swaps a spare for a drained node; an elastic job with no
spare scales down and grows back; a job without tiers or elasticity is requeued as before.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from services.api import custom_jobs
from services.api.names import Parent
from services.job_submission import commands as job_commands
from services.presentation import timeline, views
from shared.adapters.outbox import envelope_to_doc
from shared.config import ControlPlaneConfig
from shared.domain.errors import ValidationError
from shared.domain.events import (
    FleetTicked,
    JobCheckpointSaved,
    JobFirstStep,
    JobRecoveryChosen,
    JobRequeued,
)
from shared.domain.model import Job, JobState, NodeState
from tests.harness import CLUSTER, Plane, job_body, xid

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)  # no heartbeat loss on advances


def plane_with(cluster: dict[str, Any] | None = None) -> Plane:
    return Plane(QUIET).up(cluster)


def submit(plane: Plane, replicas: int = 2, labels: dict[str, str] | None = None) -> Job:
    body = job_body(replicas)
    if labels:
        body["labels"] = labels
    plane.api(lambda u, d: job_commands.submit_job("c1", body, u, d, "j1"))
    plane.deliver()
    job: Job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 1
    return job


def saved(plane: Plane, attempt: int, step: int, tier: str, save_s: float = 0.5) -> None:
    plane.inject(JobCheckpointSaved(job_id="j1", attempt=attempt, step=step,
                                    path=f"fake://j1/{tier}-{step}", saved_at=plane.clock.now(),
                                    save_s=save_s, tier=tier))
    plane.deliver()


def tiers(plane: Plane, attempt: int = 1) -> None:
    """The program saved to every tier; the durable one long ago, memory just now."""
    saved(plane, attempt, 100, "durable", 30.0)
    plane.clock.advance(600)
    saved(plane, attempt, 190, "peer", 2.0)
    plane.clock.advance(30)
    saved(plane, attempt, 195, "memory", 0.2)
    plane.clock.advance(5)


def chosen(plane: Plane) -> list[JobRecoveryChosen]:
    return [e.event for e in plane.delivered if isinstance(e.event, JobRecoveryChosen)]


def test_xid13_restarts_in_place() -> None:
    """XID 13 (RESTART_JOB): same nodes, attempt+1 at once, no PENDING, no drain, no
    backoff; the gang says in_place; the decision is explained."""
    plane = plane_with()
    first = submit(plane).node_ids
    tiers(plane)
    bad = first[0]
    plane.report(bad, xid(13, plane.clock.now()))
    plane.deliver()
    assert plane.node(bad).state is NodeState.ALLOCATED  # no drain
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert (job.state, job.attempt, tuple(job.node_ids)) == (JobState.RUNNING, 2, first)
    assert requeued(plane) == []  # never PENDING
    assert job.recovery.not_before is None and job.restart_count == 1
    gang = plane.compute.gangs[-1]
    assert gang.attempt == 2 and gang.recovery is not None
    assert gang.recovery.mode == "in_place" and gang.recovery.fresh_node_ids == ()
    [event] = chosen(plane)
    assert event.mode == "in_place" and event.incident == "app_restart"
    decision = job.recovery.decisions[-1]
    assert decision["mode"] == "in_place" and "requeue" in decision["why"]
    assert decision["expected_lost_s"] < dict(_expected(decision["why"]))["requeue"]
    # the new attempt's first step: the measured seconds from the fault, and warm startup
    plane.clock.advance(7)
    plane.inject(JobFirstStep(job_id="j1", attempt=2, step=196))
    plane.deliver()
    job = plane.job("j1")
    assert job.recovery.decisions[-1]["measured_s"] is not None
    assert job.recovery.decisions[-1]["measured_s"] >= 7
    assert "warm" in job.recovery.startup
    # explained: the job view, the API's CustomJob and the timeline say the mode
    view = views.job_view(job)["recovery"]
    assert view["mode"] == "in_place" and view["measuredSeconds"] >= 7
    assert view["expectedLostSeconds"] == decision["expected_lost_s"] and view["why"]
    wire = custom_jobs.render(job, Parent("p", "l"), "j1", {"resource": {"displayName": "t"}})
    [shown] = wire["mtcProgress"]["recovery"]
    assert shown["mode"] == "in_place" and shown["measuredSeconds"] >= 7
    line = timeline.describe(next(envelope_to_doc(e) for e in plane.delivered
                                  if isinstance(e.event, JobRecoveryChosen)))
    assert "recovery in_place" in line and "app_restart" in line


def _expected(why: str) -> list[tuple[str, float]]:
    """(mode, seconds) pairs a decision's ``why`` compares against ("; vs a 1.0s; b 2.0s")."""
    out = []
    for part in why.split("; "):
        words = part.removeprefix("vs ").split()
        if len(words) == 2 and words[1].endswith("s"):
            try:
                out.append((words[0], float(words[1][:-1])))
            except ValueError:
                continue
    return out


def test_a_drained_node_with_a_spare_ready_hot_swaps() -> None:
    """XID 79 drains the node: the spare takes only that rank at once, no backoff, the
    gang names it fresh; the drained node goes to repair as today."""
    plane = plane_with()
    first = submit(plane, 3).node_ids
    tiers(plane)
    bad = first[1]
    plane.report(bad, xid(79, plane.clock.now()))
    plane.deliver()
    assert plane.node(bad).state is NodeState.DRAINING
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2
    assert job.node_ids[0] == first[0] and job.node_ids[2] == first[2]
    assert job.node_ids[1] == "c1-gpu-003"  # the spare, in the lost rank
    assert job.recovery.not_before is None and requeued(plane) == []
    gang = plane.compute.gangs[-1]
    assert gang.recovery is not None and gang.recovery.mode == "hot_swap"
    assert gang.recovery.fresh_node_ids == ("c1-gpu-003",)
    assert plane.node(bad).state is NodeState.REPAIRING
    assert [e.mode for e in chosen(plane)] == ["hot_swap"]


SPARELESS: dict[str, Any] = copy.deepcopy(CLUSTER)
SPARELESS["nodePools"][0]["spareCount"] = 0


def test_an_elastic_job_scales_down_then_grows_back() -> None:
    """No spare: the elastic job keeps RUNNING on the rest with fewer replicas (WORLD_SIZE
    follows); when the repaired node returns it restarts at full size."""
    plane = plane_with(SPARELESS)
    first = submit(plane, 4, {"mtc-min-replicas": "2"}).node_ids
    tiers(plane)
    bad = first[2]
    plane.report(bad, xid(79, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2
    assert tuple(job.node_ids) == (first[0], first[1], first[3])
    assert job.recovery.replicas == 3
    gang = plane.compute.gangs[-1]
    assert gang.world_size == 3 and gang.recovery is not None
    assert gang.recovery.mode == "scale_down"
    assert {w.world_size for w in gang.workers()} == {3}
    # the node is repaired and returns: the job is asked to grow, then restarts at 4
    plane.finish_repairs()
    for _ in range(2):
        plane.clock.advance(1)
        plane.report(bad, _healthy(plane))
        plane.deliver()
    assert plane.node(bad).state is NodeState.IDLE
    assert ("j1", 2) in plane.compute.signalled  # asked to grow
    plane.exit_workers("j1", 2, 75)
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 3 and job.recovery.replicas is None
    assert len(job.node_ids) == 4 and bad in job.node_ids
    gang = plane.compute.gangs[-1]
    assert gang.world_size == 4 and gang.recovery is not None
    assert gang.recovery.mode == "hot_swap" and gang.recovery.fresh_node_ids == (bad,)
    assert [e.mode for e in chosen(plane)] == ["scale_down", "hot_swap"]
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()
    assert ("j1", 3) not in plane.compute.signalled  # at full size: no more growing


def _healthy(plane: Plane) -> tuple[dict[str, Any], ...]:
    from tests.harness import healthy
    return healthy(plane.clock.now())


def requeued(plane: Plane) -> list[JobRequeued]:
    return [e.event for e in plane.delivered if isinstance(e.event, JobRequeued)]


def test_without_tiers_or_elasticity_nothing_changes() -> None:
    """Durable checkpoints only: XID 13, then XID 79 with a spare ready, are requeued as
    today (JobRequeued, through PENDING); no decision is recorded, no gang carries a plan."""
    plane = plane_with()
    first = submit(plane, 3).node_ids
    saved(plane, 1, 100, "durable", 30.0)
    plane.report(first[0], xid(13, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    assert len(requeued(plane)) == 1 and plane.job("j1").attempt == 2
    plane.report(first[0], _healthy(plane))  # (the XID 13 has cleared)
    saved(plane, 2, 120, "durable", 30.0)
    plane.report(first[1], xid(79, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 2, 75)
    job = plane.job("j1")
    assert len(requeued(plane)) == 2 and job.attempt == 3
    assert job.node_ids[1] == "c1-gpu-003"  # today's requeue filled the hole with the spare
    assert chosen(plane) == [] and job.recovery.decisions == []
    assert all(g.recovery is None for g in plane.compute.gangs)


def test_a_pin_wins_where_allowed() -> None:
    """mtc-recovery-mode=requeue on the job: a job with tiers is requeued, and says why."""
    plane = plane_with()
    first = submit(plane, 2, {"mtc-recovery-mode": "requeue"}).node_ids
    tiers(plane)
    plane.report(first[0], xid(13, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    job = plane.job("j1")
    assert len(requeued(plane)) == 1 and job.recovery.decisions[-1]["mode"] == "requeue"
    assert [e.mode for e in chosen(plane)] == ["requeue"]
    assert job.recovery.decisions[-1]["why"].startswith("pinned to requeue")


def test_a_stale_exit_after_an_in_place_restart_changes_nothing() -> None:
    plane = plane_with()
    first = submit(plane).node_ids
    tiers(plane)
    plane.report(first[0], xid(13, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    plane.exit_workers("j1", 1, 75)  # redelivered / late
    job = plane.job("j1")
    assert job.attempt == 2 and job.state is JobState.RUNNING and len(chosen(plane)) == 1


@pytest.mark.parametrize(("labels", "field"), [
    ({"mtc-recovery-mode": "fast"}, "labels.mtc-recovery-mode"),
    ({"mtc-min-replicas": "x"}, "labels.mtc-min-replicas"),
    ({"mtc-min-replicas": "9"}, "labels.mtc-min-replicas"),
])
def test_bad_recovery_labels_are_refused(labels: dict[str, str], field: str) -> None:
    plane = plane_with()
    body = {**job_body(2), "labels": labels}
    with pytest.raises(ValidationError) as err:
        plane.api(lambda u, d: job_commands.submit_job("c1", body, u, d, "j1"))
    assert field in str(err.value)


def test_tier_saves_are_policy_inputs_not_durable_checkpoints() -> None:
    """A memory or peer save is recorded per tier (newest kept, a redelivery or an older
    one changes nothing) and never becomes the durable checkpoint a requeue resumes from."""
    plane = plane_with()
    submit(plane)
    tiers(plane)
    saved(plane, 1, 150, "memory")  # older than the kept one
    saved(plane, 1, 195, "memory")  # a redelivery
    job = plane.job("j1")
    assert [c.step for c in job.checkpoints] == [100]
    assert job.recovery.tiers["memory"]["step"] == 195
    assert job.recovery.tiers["peer"]["step"] == 190
