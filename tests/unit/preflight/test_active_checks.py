"""Active checks on idle nodes through the real handlers: never more than the configured
share of idle nodes under check, a check yields to a job that wants its node, and a
known-answer mismatch (the real test, fault-injected) becomes a condition that triage acts on."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from services.job_submission import commands as job_commands
from shared.config import ControlPlaneConfig
from shared.domain.events import FleetTicked, NodeDiagnosed
from shared.domain.health import ACTIVE_CHECK_SOURCE, ConditionType, RepairAction
from shared.domain.model import JobState, NodeState
from shared.policies.active_checks import ActiveCheckConfig, IdleNode, budget, pick
from shared.probes import known_answer
from shared.service_layer.active_checks import ACTIVE_CHECK, KEY
from tests.harness import FakeCompute, Plane, job_body


@dataclass
class CheckingCompute(FakeCompute):
    """The fake machines with the ActiveChecks capability: it records what it was asked."""

    checks: dict[str, str] = field(default_factory=dict)  # node -> key in flight
    cancelled: list[str] = field(default_factory=list)

    def start_active_check(self, node_id: str, key: str) -> None:
        self.checks[node_id] = key

    def cancel_active_check(self, node_id: str, key: str) -> None:
        self.checks.pop(node_id, None)
        self.cancelled.append(node_id)


def plane(share: float = 0.5) -> tuple[Plane, CheckingCompute]:
    config = replace(ControlPlaneConfig(),
                     active_checks=ActiveCheckConfig(interval_s=600, max_share=share))
    p = Plane(config)
    compute = CheckingCompute(clock=p.clock)
    p.compute = compute
    p.deps = replace(p.deps, compute=compute)
    p.up()
    compute.checks.clear()
    return p, compute


def tick(p: Plane) -> None:
    p.clock.advance(1)  # (a tick is keyed by its time: a second one at the same time is a duplicate)
    p.inject(FleetTicked(cluster_id="c1", at=p.clock.now()))
    p.deliver()


def answer(p: Plane, compute: CheckingCompute, node_id: str, corrupt_by: int = 0) -> None:
    """The node's check ends: the real known-answer test, its result reported."""
    key = compute.checks.pop(node_id)
    cond = known_answer.condition(known_answer.compute(corrupt_by=corrupt_by, repeats=1),
                                  p.clock.now(), extra={KEY: key})
    p.report(node_id, (cond.to_dict(),), source=ACTIVE_CHECK_SOURCE)
    p.deliver()


def idle(p: Plane) -> list[str]:
    return [n.node_id for n in p.nodes("c1") if n.state is NodeState.IDLE and "gpu" in n.node_id]


def test_never_more_than_the_share_of_idle_nodes_at_once() -> None:
    p, compute = plane(share=0.5)
    nodes = idle(p)
    tick(p)
    assert len(compute.checks) == budget(len(nodes), p.deps.config.active_checks) == 2
    for _ in range(3):  # later ticks while they run start nothing more (within the
        tick(p)  # heartbeat timeout: the fake agents send none)
    assert len(compute.checks) == 2
    first = sorted(compute.checks)
    answer(p, compute, first[0])
    tick(p)  # one slot free: a node never checked goes first
    assert len(compute.checks) == 2 and not set(compute.checks) & {first[0]}
    assert p.node(first[0]).conditions[ACTIVE_CHECK].reason.startswith("passed")


def test_a_check_yields_to_a_job_that_wants_the_node() -> None:
    p, compute = plane(share=0.5)
    tick(p)
    checked = set(compute.checks)
    assert checked
    p.api(lambda u, d: job_commands.submit_job("c1", job_body(len(idle(p)) - 1), u, d, "j1"))
    p.deliver()
    job = p.job("j1")
    assert job.state is JobState.RUNNING  # started at once, not after the checks
    taken = checked & set(job.node_ids)
    assert taken and set(compute.cancelled) == taken
    for node_id in taken:
        assert p.node(node_id).conditions[ACTIVE_CHECK].reason.startswith("cancelled")


def test_a_known_answer_mismatch_becomes_a_condition_and_triage_acts() -> None:
    p, compute = plane(share=0.5)
    tick(p)
    node_id = sorted(compute.checks)[0]
    answer(p, compute, node_id, corrupt_by=1)  # the node computes one wrong entry
    cond = p.node(node_id).conditions[ConditionType.KNOWN_ANSWER_MISMATCH.value]
    assert cond.status == "true" and "silent data corruption" in cond.reason
    diagnosed = [e.event for e in p.delivered if isinstance(e.event, NodeDiagnosed)
                 and e.event.node_id == node_id]
    assert diagnosed[-1].failure_mode == "silent_data_corruption"
    assert diagnosed[-1].action == RepairAction.REPLACE.value
    assert p.node(node_id).state is not NodeState.IDLE  # out of service for its repair


def test_pick_prefers_the_longest_unchecked_and_respects_the_interval() -> None:
    config = ActiveCheckConfig(interval_s=100, max_share=0.5)
    nodes = [IdleNode("a", 50.0, False), IdleNode("b", None, False),
             IdleNode("c", 10.0, False), IdleNode("d", 190.0, False)]
    assert pick(nodes, 200.0, config) == ("b", "c")
    assert pick(nodes, 200.0, replace(config, enabled=False)) == ()
    assert pick([*nodes[:3], IdleNode("d", 0.0, True)], 200.0, config) == ("b",)
    assert budget(9, ActiveCheckConfig(max_share=0.1)) == 0
