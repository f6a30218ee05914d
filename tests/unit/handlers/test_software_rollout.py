"""A software rollout through the real handlers on the stepped clock: waves of reimages, each
node gated by its deep checks; a version that fails the gate in its third wave is rolled back
everywhere, automatically, with an alert, and the job keeps running."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from services.job_submission import commands as job_commands
from services.repair import rollout
from shared.domain.errors import Conflict
from shared.domain.events import AlertRaised, FleetTicked, NodeReturnedToService
from shared.domain.health import RepairAction
from shared.domain.model import JobState, NodeState
from shared.policies.rollout import ROLLOUTS
from tests.harness import CLUSTER, Plane, deep_check_results, healthy, job_body

NEW = {"nodeImage": "mtc-node-2026-12", "driver": "560.35"}
CLUSTER8 = {**CLUSTER, "nodePools": [{**CLUSTER["nodePools"][0], "nodeCount": 8,
                                      "spareCount": 0}]}


def play(plane: Plane, bad: dict[str, str] | None = None, rounds: int = 40) -> None:
    """Play the machines until quiet: repairs complete, deep checks answer (failing on a node
    whose software matches ``bad``), agents report healthy, the fleet ticks."""
    answered: set[tuple[str, int]] = set()
    exited: set[tuple[str, int]] = set()
    for _ in range(rounds):
        plane.clock.advance(30)
        for signalled in list(plane.compute.signalled):
            if signalled not in exited:  # checkpointed on SIGTERM: it moves
                exited.add(signalled)
                plane.exit_workers(*signalled, 75)
        plane.finish_repairs()
        for node_id, attempt in list(plane.compute.deep_checks):
            if (node_id, attempt) in answered:
                continue
            answered.add((node_id, attempt))
            failing = bad is not None and all(
                plane.node(node_id).software.get(k) == v for k, v in bad.items())
            state = "true" if failing else "false"
            plane.report(node_id, deep_check_results(plane.clock.now(), attempt, dcgm=state),
                         source="deep-check")
        for node in plane.nodes("c1"):
            if node.state is not NodeState.RETIRED:
                plane.report(node.node_id, healthy(plane.clock.now()))
        plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
        plane.deliver()


def record(plane: Plane) -> dict[str, Any]:
    with plane.uow() as uow:
        found = uow.records(ROLLOUTS, {"cluster_id": "c1"})
    assert len(found) == 1
    return found[0]  # type: ignore[no-any-return]


def start(plane: Plane, **body: Any) -> dict[str, Any]:
    out: dict[str, Any] = plane.api(
        lambda u, d: rollout.start("c1", {"version": NEW, **body}, "ops", u, d))
    return out


def test_a_rollout_updates_every_node_in_waves_gated_by_deep_checks() -> None:
    plane = Plane().up(CLUSTER8)
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    busy = set(plane.job("j1").node_ids)
    rec = start(plane, waveSize=2, canary=1)
    # idle nodes first, the canary alone, waves of two (the guard allows 2 of 8 out)
    assert [len(w) for w in rec["waves"]] == [1, 2, 2, 2, 1]
    assert set(rec["waves"][-1]) | set(rec["waves"][-2][1:]) == busy
    assert plane.compute.staged == {rec["waves"][0][0]: NEW}  # only the canary so far
    play(plane)
    rec = record(plane)
    assert rec["state"] == "SUCCEEDED"
    workers = [n for n in plane.nodes("c1") if n.role.value == "worker"]
    assert all(n.software == NEW and n.state is not NodeState.RETIRED for n in workers)
    assert {n for n, _ in plane.compute.deep_checks} >= {n.node_id for n in workers}
    job = plane.job("j1")
    assert job.state is JobState.RUNNING  # its nodes drained, it moved and runs on


def test_a_third_wave_failing_its_gate_rolls_everything_back_and_alerts() -> None:
    plane = Plane().up(CLUSTER8)
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    job_nodes = tuple(plane.job("j1").node_ids)
    before = {n.node_id: n.software for n in plane.nodes("c1")}
    rec = start(plane, waveSize=2, canary=1)
    third = set(rec["waves"][2])
    # the new version passes on waves 1 and 2, fails the gate on wave 3's nodes
    for _ in range(40):
        current = record(plane)
        if current["wave"] >= 2 or current["state"] != "RUNNING":
            break
        play(plane, rounds=1)
    assert record(plane)["wave"] == 2
    play(plane, bad=NEW)
    rec = record(plane)
    assert rec["state"] == "ROLLED_BACK", rec
    assert rec["paused_wave"] == 3 and "deep-check gate" in rec["reason"]
    assert third <= set(rec["reason"].replace(",", " ").split())
    after = {n.node_id: n.software for n in plane.nodes("c1")}
    assert after == before  # every node on its old version again
    assert all(n.state is NodeState.IDLE or n.state is NodeState.ALLOCATED
               for n in plane.nodes("c1") if n.role.value == "worker")
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and tuple(job.node_ids) == job_nodes
    alerts = [e.event for e in plane.delivered if isinstance(e.event, AlertRaised)
              and e.event.kind == "rollout_rolled_back"]
    assert alerts and alerts[0].state == "firing" and "c1" in alerts[0].summary
    # the later waves were never touched
    untouched = {n for w in rec["waves"][3:] for n in w}
    assert not untouched & {n for n, _ in plane.compute.deep_checks}
    assert all(a is RepairAction.REIMAGE for n, a, _ in plane.compute.repairs)


def test_redelivered_events_change_nothing_mid_rollout() -> None:
    plane = Plane().up(CLUSTER8)
    start(plane, waveSize=2, canary=1)
    play(plane, rounds=2)
    before = (record(plane), plane.store.snapshot()["nodes"], list(plane.compute.repairs),
              dict(plane.compute.staged))
    # the same facts again under new ids (an at-least-once producer): the returns and a tick
    returned = [e.event for e in plane.delivered if isinstance(e.event, NodeReturnedToService)]
    for event in returned[-3:]:
        plane.inject(event, source="//redelivered")
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()), source="//redelivered")
    plane.deliver()
    after = (record(plane), plane.store.snapshot()["nodes"], list(plane.compute.repairs),
             dict(plane.compute.staged))
    assert after == before


def test_a_compute_that_cannot_choose_the_image_refuses_a_rollout() -> None:
    plane = Plane().up(CLUSTER8)
    blind = dataclasses.replace(plane.deps, compute=SimpleNamespace())  # no stage_software
    with plane.uow() as uow, pytest.raises(Conflict) as err:
        rollout.start("c1", {"version": NEW}, "ops", uow, blind)
    assert "SoftwareImages" in str(err.value)
    with plane.uow() as uow:
        assert uow.records(ROLLOUTS, {"cluster_id": "c1"}) == []
