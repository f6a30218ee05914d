"""A report observed before a node's last repair (or its provisioning), delivered after it,
is history: it must not act on the repaired node (NVSentinel #1347, ParallelCluster #4751)."""

from __future__ import annotations

from services.job_submission import commands as job_commands
from shared.domain.events import Envelope, NodeHealthReported, NodeProvisioned
from shared.domain.health import RepairAction
from shared.domain.model import NodeState
from shared.handling import Outcome
from tests.harness import CLUSTER, Plane, healthy, xid

NODE = "c1-gpu-000"


def ready_plane() -> tuple[Plane, dict[str, dict[str, Outcome]]]:
    """The plane, and each delivered event's outcome per service (by envelope id)."""
    plane = Plane()
    outcomes: dict[str, dict[str, Outcome]] = {}
    plane.bus.listeners.append(lambda env, out: outcomes.__setitem__(env.id, dict(out)))
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()
    plane.bring_up()
    return plane, outcomes


def repaired(plane: Plane) -> float:
    """XID 79 on an idle node -> drained -> reboot -> repair ok -> VERIFYING. Returns when
    the XID was observed (the report reaches the control plane a second later)."""
    plane.clock.advance(10)
    observed = plane.clock.now()
    plane.report(NODE, xid(79, observed))
    plane.clock.advance(1)
    plane.deliver()
    assert plane.compute.repairs == [(NODE, RepairAction.REBOOT, 1)]
    plane.clock.advance(120)
    plane.finish_repairs()
    assert plane.node(NODE).state is NodeState.VERIFYING
    return observed


def late(plane: Plane, observed_at: float) -> Envelope:
    """The XID report observed at ``observed_at`` arrives again (a new delivery: an agent
    resending after a lost response, a redelivery under a new id)."""
    env = plane.inject(NodeHealthReported(node_id=NODE, observed_at=observed_at,
                                          conditions=xid(79, observed_at)))
    plane.deliver()
    return env


def test_stale_report_after_repair_does_not_escalate() -> None:
    plane, outcomes = ready_plane()
    observed = repaired(plane)
    before = plane.store.snapshot()["nodes"][NODE]

    plane.clock.advance(5)
    env = late(plane, observed)

    assert outcomes[env.id] == {"health_triage": Outcome.STALE}
    assert plane.node(NODE).state is NodeState.VERIFYING
    assert plane.compute.repairs == []  # no reimage: finish_repairs cleared the reboot
    assert plane.store.snapshot()["nodes"][NODE] == before  # changed nothing

    # the repaired node still returns on its own fresh checks
    for _ in range(plane.deps.config.repair.return_after_passes):
        plane.clock.advance(1)
        plane.report(NODE, healthy(plane.clock.now()))
        plane.deliver()
    assert plane.node(NODE).state is NodeState.IDLE


def test_fresh_report_after_repair_still_escalates() -> None:
    plane, outcomes = ready_plane()
    repaired(plane)

    plane.clock.advance(5)
    env = late(plane, plane.clock.now())  # observed after the repair: the fault is back

    assert outcomes[env.id] == {"health_triage": Outcome.HANDLED}
    assert plane.compute.repairs == [(NODE, RepairAction.REIMAGE, 2)]
    assert plane.node(NODE).state is NodeState.REPAIRING


def test_report_observed_during_the_drain_is_stale_after_the_repair() -> None:
    """Observed after the diagnosis but before the repair started: still the old node."""
    plane, _ = ready_plane()
    plane.clock.advance(10)
    plane.report(NODE, xid(79, plane.clock.now()))
    between = plane.clock.now() + 0.5
    plane.clock.advance(1)
    plane.deliver()
    plane.clock.advance(120)
    plane.finish_repairs()

    late(plane, between)
    assert plane.node(NODE).state is NodeState.VERIFYING
    assert plane.compute.repairs == []


def test_report_older_than_provisioning_is_stale() -> None:
    plane = Plane()
    plane.clock.advance(100)
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()
    plane.inject(NodeProvisioned(node_id=NODE))
    plane.deliver()
    assert plane.node(NODE).state is NodeState.VERIFYING

    late(plane, plane.clock.now() - 60)  # from before this node was asked for
    node = plane.node(NODE)
    assert node.state is NodeState.VERIFYING
    assert node.last_report_at is None and not node.conditions
    assert plane.compute.repairs == [] and not plane.compute.cordoned


def test_a_spooled_report_delivered_after_its_age_limit_is_stale_however_it_travelled() -> None:
    """An agent's spool sends a report hours late through a transport that stamps its own
    time (the API): triage ages it by when it was observed, records it, acts on nothing."""
    plane, outcomes = ready_plane()
    max_age = plane.deps.config.max_event_age_s
    plane.clock.advance(max_age + 100)
    env = late(plane, plane.clock.now() - max_age - 10)  # envelope time: now
    assert outcomes[env.id] == {"health_triage": Outcome.STALE}
    assert plane.node(NODE).state is NodeState.IDLE and plane.compute.repairs == []

    env = late(plane, plane.clock.now() - max_age + 60)  # late, but young enough: acted on
    assert outcomes[env.id] == {"health_triage": Outcome.HANDLED}
    assert plane.compute.repairs == [(NODE, RepairAction.REBOOT, 1)]
