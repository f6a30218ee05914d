"""Preflight through the real handlers: a node that fails the gang's all-reduce (a real
multi-process gloo run, one node's link slowed by fault injection) is excluded, reported
(condition + event, triage acts) and the job placed again; the time it took is scheduling
badput of the job in the one goodput accounting."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.job_submission import commands as job_commands
from shared import goodput
from shared.adapters.compute.preflight_gloo import GlooPreflight
from shared.domain.errors import ValidationError
from shared.domain.events import JobPreflightChecked, JobStarted, NodeDiagnosed
from shared.domain.health import ConditionType
from shared.domain.model import JobState
from shared.policies.preflight import (
    PLANS,
    NodeCheck,
    PairCheck,
    PreflightPlan,
    PreflightResult,
    culprits,
    plan_for,
    wanted,
)
from tests.harness import CLUSTER, FakeCompute, Plane, job_body, xid

QUICK: dict[str, Any] = copy.deepcopy(CLUSTER)
QUICK["labels"] = {"mtc-preflight": "quick"}
QUICK["nodePools"][0]["nodeCount"] = 6  # a 3-node gang placed again without its culprit


@dataclass
class PreflightCompute(FakeCompute):
    """The fake machines plus the real gloo preflight; the manual clock moves by the time
    the preflight really took, so its cost lands in the log as it would live."""

    gloo: GlooPreflight = field(default_factory=GlooPreflight)

    def run_preflight(self, job_id: str, node_ids: Any, plan: PreflightPlan
                      ) -> PreflightResult:
        result = self.gloo.run_preflight(job_id, node_ids, plan)
        self.clock.advance(result.finished_at - result.started_at)
        return result


def plane_with_preflight() -> tuple[Plane, PreflightCompute]:
    plane = Plane()
    compute = PreflightCompute(clock=plane.clock)
    plane.compute = compute
    plane.deps = type(plane.deps)(**{**plane.deps.__dict__, "compute": compute})
    plane.up(QUICK)
    return plane, compute


@pytest.mark.slow
def test_preflight_excludes_the_node_with_a_slow_link_and_costs_scheduling_badput() -> None:
    plane, compute = plane_with_preflight()
    idle = [n.node_id for n in plane.nodes("c1") if "gpu" in n.node_id]
    compute.gloo.degrade_link(idle[0], 0.3)  # every collective it joins waits 0.3 s
    submitted_at = plane.clock.now()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(3), u, d, "j1"))
    plane.deliver()
    checks = [e.event for e in plane.delivered if isinstance(e.event, JobPreflightChecked)]
    assert checks[0].failed_node_ids == (idle[0],), checks
    assert checks[-1].failed_node_ids == () and idle[0] not in checks[-1].node_ids
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and idle[0] not in job.node_ids
    started = [e.event for e in plane.delivered if isinstance(e.event, JobStarted)]
    assert len(started) == 1 and idle[0] not in started[0].node_ids
    # reported: the condition is on the node and triage diagnosed it (its ladder acts)
    bad = plane.node(idle[0])
    assert bad.conditions[ConditionType.COLLECTIVE_BANDWIDTH_LOW.value].status == "true"
    diagnosed = [e.event for e in plane.delivered if isinstance(e.event, NodeDiagnosed)
                 and e.event.node_id == idle[0]]
    assert diagnosed and diagnosed[0].failure_mode == "collective_bandwidth_low"
    # the time both preflights took is the job's scheduling badput, cause "preflight"
    rows = [{"type": e.type, "time": e.time, "data": e.event.to_dict()}
            for e in plane.delivered]
    params = {"j1": goodput.JobParams(step_time_s=1.0, checkpoint_save_s=1.0,
                                      checkpoint_restore_s=1.0, startup_s=1.0, nodes=3)}
    acct = goodput.account(rows, params=params, start=submitted_at,
                           end=plane.clock.now() + 60)
    spent = sum(c.finished_at - c.started_at for c in checks)
    lost = acct.jobs["j1"].badput[(goodput.Badput.WAITING_FOR_CAPACITY, "preflight")]
    assert spent > 0 and lost == pytest.approx(spent)
    assert goodput.Badput.WAITING_FOR_CAPACITY in goodput.SCHEDULING


def _result(*pairs: tuple[tuple[str, ...], float | None], bad_node: str = "") -> PreflightResult:
    nodes = sorted({n for p, _ in pairs for n in p})
    return PreflightResult(tuple(NodeCheck(n, n != bad_node, "stand-in") for n in nodes),
                           tuple(PairCheck(p, bw) for p, bw in pairs), 0.0, 1.0)


def test_culprits_name_the_node_whose_every_pair_is_slow() -> None:
    plan = PLANS["quick"]
    slow = _result((("a", "b", "c"), 0.001), (("a", "b"), 1.0), (("b", "c"), 0.001),
                   (("a", "c"), 0.001))
    assert [c.node_id for c in culprits(slow, plan)] == ["c"]
    fabric = _result((("a", "b", "c"), 0.001), (("a", "b"), 0.001), (("b", "c"), 0.001),
                     (("a", "c"), 0.001))
    assert culprits(fabric, plan) == ()  # every pair slow: the floor or the fabric
    pair = _result((("a", "b"), None))
    assert [c.node_id for c in culprits(pair, plan)] == ["a", "b"]  # cannot tell apart
    own = _result((("a", "b"), 1.0), bad_node="b")
    assert [(c.node_id, c.collective) for c in culprits(own, plan)] == [("b", False)]
    assert culprits(_result((("a", "b"), 1.0)), plan) == ()


def test_the_mode_label_is_validated_and_off_runs_nothing() -> None:
    plane = Plane()
    with pytest.raises(ValidationError, match="mtc-preflight"):
        plane.api(job_commands.create_cluster, {**CLUSTER, "labels": {"mtc-preflight": "x"}})
    with pytest.raises(ValidationError, match=r"labels\.mtc-preflight-min-busbw-gbps"):
        plane.api(job_commands.create_cluster, {**CLUSTER, "labels": {
            "mtc-preflight": "quick", "mtc-preflight-min-busbw-gbps": "-3"}})
    plan = plan_for((("mtc-preflight", "thorough"), ("mtc-preflight-min-busbw-gbps", "300")))
    assert plan is not None and plan.min_busbw_gbps == 300.0 and plan.dcgm_level == 2
    plane.up()  # no label: off
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    assert plane.job("j1").state is JobState.RUNNING
    assert not [e for e in plane.delivered if isinstance(e.event, JobPreflightChecked)]


def test_a_backend_without_preflight_starts_the_job_and_says_it_did_not_run() -> None:
    plane = Plane().up(QUICK)
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    checks = [e.event for e in plane.delivered if isinstance(e.event, JobPreflightChecked)]
    assert len(checks) == 1 and checks[0].detail.startswith("not run")
    assert plane.job("j1").state is JobState.RUNNING


@dataclass
class RecordingPreflight(FakeCompute):
    """A preflight that passes and remembers the gangs it checked (no processes)."""

    checked: list[tuple[str, ...]] = field(default_factory=list)

    def run_preflight(self, job_id: str, node_ids: Any, plan: PreflightPlan
                      ) -> PreflightResult:
        self.checked.append(tuple(node_ids))
        now = self.clock.now()
        return PreflightResult((), (PairCheck(tuple(node_ids), 1.0),), now, now)


def test_a_requeued_job_placed_on_a_new_node_is_preflighted_with_all_its_nodes() -> None:
    plane = Plane()
    compute = RecordingPreflight(clock=plane.clock)
    plane.compute = compute
    plane.deps = type(plane.deps)(**{**plane.deps.__dict__, "compute": compute})
    body: dict[str, Any] = copy.deepcopy(CLUSTER)
    body["labels"] = {"mtc-preflight": "quick", "mtc-recovery-mode": "requeue"}
    plane.up(body)
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    first = plane.job("j1")
    assert compute.checked == [tuple(first.node_ids)]  # before the first start
    bad, good = first.node_ids
    plane.clock.advance(5)
    plane.report(bad, xid(79, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)  # checkpointed on SIGTERM, requeued, placed again
    job = plane.job("j1")
    assert job.attempt == 2 and bad not in job.node_ids and good in job.node_ids
    assert compute.checked[-1] == tuple(job.node_ids)  # the kept node and the new one
    assert len(compute.checked) == 2
    # a restart on the nodes the job held (a preempted program) needs none
    assert not wanted(2, []) and wanted(0, []) and wanted(2, ["c1-gpu-002"])
