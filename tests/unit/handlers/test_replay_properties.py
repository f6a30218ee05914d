"""Delivery is at least once and unordered: duplicates, replays and shuffles within causality
must end in the same state as a clean run."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.job_submission import commands as job_commands
from shared.adapters.docstore import CLUSTERS, JOBS, NODES, PARTITIONS
from shared.domain.events import NodeHealthReported
from shared.domain.model import NodeState
from tests.harness import CLUSTER, Plane, healthy, job_body, xid

ENTITIES = (CLUSTERS, NODES, JOBS, PARTITIONS)


def story(plane: Plane, chaos: Any = None) -> dict[str, Any]:
    """Bring up, run a job, fault a node, checkpoint-requeue, repair, finish. ``chaos`` is
    called after every step with the plane and may redeliver or shuffle what it likes."""

    def step() -> None:
        plane.deliver()
        if chaos is not None:
            chaos(plane)
            plane.deliver()

    plane.api(job_commands.create_cluster, CLUSTER)
    step()
    plane.bring_up()
    step()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    step()
    bad = plane.job("j1").node_ids[0]
    plane.clock.advance(5)
    others = [n.node_id for n in plane.nodes("c1") if n.node_id not in (bad, "c1-login")]
    reports = [(bad, xid(79, plane.clock.now()))] + [(n, healthy(plane.clock.now()))
                                                      for n in others]
    if chaos is not None:
        reports = chaos.order(reports)
    for node_id, conditions in reports:
        plane.report(node_id, conditions)
    step()
    plane.exit_workers("j1", 1, 75)
    step()
    plane.finish_repairs()
    step()
    for _ in range(2):
        plane.clock.advance(1)
        plane.report(bad, healthy(plane.clock.now()))
        step()
    plane.exit_workers("j1", 2, 0)
    step()
    snap = plane.store.snapshot()
    return {k: snap.get(k, {}) for k in ENTITIES}


REFERENCE = story(Plane())


class Chaos:
    def __init__(self, data: Any) -> None:
        self.data = data

    def order(self, items: list[Any]) -> list[Any]:
        return list(self.data.draw(st.permutations(items), label="report order"))

    def __call__(self, plane: Plane) -> None:
        if not plane.delivered:
            return
        picks = self.data.draw(st.lists(st.sampled_from(plane.delivered), max_size=6),
                               label="redelivered")
        for env in picks:
            plane.bus.inject(env)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_duplicates_and_shuffles_end_in_the_same_state(data: Any) -> None:
    assert story(Plane(), Chaos(data)) == REFERENCE


def test_replaying_the_whole_stream_twice_changes_nothing() -> None:
    plane = Plane()
    first = story(plane)
    for env in list(plane.delivered):
        plane.bus.inject(env)
    plane.deliver()
    snap = plane.store.snapshot()
    assert {k: snap.get(k, {}) for k in ENTITIES} == first


def test_an_old_fault_report_does_not_redrain_a_repaired_node() -> None:
    plane = Plane()
    story(plane)
    bad = next(e.event.node_id for e in plane.delivered if e.type == "mtc.node.diagnosed.v1")
    old = next(e for e in plane.delivered if e.type == NodeHealthReported.TYPE
               and e.event.node_id == bad and e.event.conditions[0].get("status") == "true")
    replayed = NodeHealthReported(node_id=bad, observed_at=old.event.observed_at,
                                  conditions=old.event.conditions)
    plane.inject(replayed, source="//replayed-after-outage")  # a new id: not a duplicate
    plane.deliver()
    assert plane.node(bad).state is NodeState.IDLE


def test_events_older_than_the_age_limit_are_dropped() -> None:
    plane = Plane()
    story(plane)
    node = "c1-gpu-002"
    env = plane.report(node, xid(79, plane.clock.now()))
    plane.clock.advance(plane.deps.config.max_event_age_s + 1)
    plane.deliver()
    assert plane.node(node).state is NodeState.IDLE
    assert env.id  # delivered, and dropped as stale by every subscriber
