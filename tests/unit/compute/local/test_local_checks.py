"""LocalCompute's checks: an active check reports once (the real known-answer test; an
injected KnownAnswerMismatch computes wrong), a cancelled one reports nothing, and a
preflight is a real gloo all-reduce in which a node with an injected slow link is named."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from local_compute_support import FakeClock

from shared.adapters.compute.local.compute import LocalCompute
from shared.domain.events import NodeHealthReported
from shared.domain.health import ACTIVE_CHECK_SOURCE, Condition, ConditionStatus, ConditionType
from shared.domain.model import Node, NodeRole, NodeState
from shared.policies.preflight import PLANS, culprits
from shared.ports import ActiveChecks, Preflight
from tests.harness import Recorder

CT = ConditionType


def node(node_id: str) -> Node:
    return Node(node_id=node_id, cluster_id="c1", pool="gpu", partition="p1",
                role=NodeRole.WORKER, machine_type="a3-highgpu-8g",
                accelerator_type="nvidia-h100-80gb", accelerator_count=8,
                state=NodeState.PROVISIONING, since=0.0)


def up(compute: LocalCompute, *ids: str) -> None:
    for node_id in ids:
        compute.provision_node(node(node_id))
    compute.poll()


def fault(ctype: str) -> Condition:
    return Condition(ctype, ConditionStatus.TRUE, "injected", 1000.0,
                     {"corrupt": True} if ctype == CT.KNOWN_ANSWER_MISMATCH.value else {})


def test_active_checks_report_once_and_a_cancelled_one_never(
        make_compute: Callable[..., LocalCompute], clock: FakeClock,
        recorder: Recorder) -> None:
    compute = make_compute(active_check_duration_s=5.0)
    assert isinstance(compute, ActiveChecks) and isinstance(compute, Preflight)
    up(compute, "n1", "n2", "n3")
    compute.inject_fault("n2", [fault(CT.KNOWN_ANSWER_MISMATCH.value),
                                fault(CT.DCGM_DIAG_FAILED.value)])
    recorder.events.clear()
    compute.start_active_check("n1", "k1")
    compute.start_active_check("n1", "k1")  # a repeat: one check
    compute.start_active_check("n2", "k2")
    compute.start_active_check("n3", "k3")
    compute.cancel_active_check("n3", "k3")  # a job took it
    compute.poll()
    assert not recorder.of(NodeHealthReported)  # not done yet
    clock.advance(5.0)
    compute.poll()
    compute.poll()
    reports = {r.node_id: r for r in recorder.of(NodeHealthReported)}
    assert sorted(reports) == ["n1", "n2"]
    assert all(r.source == ACTIVE_CHECK_SOURCE for r in reports.values())
    by_type = {c["type"]: c for c in reports["n1"].conditions}
    assert by_type[CT.KNOWN_ANSWER_MISMATCH.value]["status"] == "false"
    assert CT.DCGM_DIAG_FAILED.value not in by_type  # no dcgmi: not run, not a pass
    assert by_type[CT.KNOWN_ANSWER_MISMATCH.value]["details"]["active_check_key"] == "k1"
    wrong = {c["type"]: c for c in reports["n2"].conditions}[CT.KNOWN_ANSWER_MISMATCH.value]
    assert wrong["status"] == "true" and wrong["details"]["corrupt"] is True
    dcgm = {c["type"]: c for c in reports["n2"].conditions}[CT.DCGM_DIAG_FAILED.value]
    assert dcgm["status"] == "true" and dcgm["details"]["active_check_key"] == "k2"


@pytest.mark.slow
def test_preflight_names_the_node_with_an_injected_slow_link(
        make_compute: Callable[..., LocalCompute]) -> None:
    compute = make_compute()
    up(compute, "n1", "n2", "n3")
    compute.inject_fault("n3", [fault(CT.COLLECTIVE_BANDWIDTH_LOW.value)])
    result = compute.run_preflight("j1", ["n1", "n2", "n3"], PLANS["quick"])
    assert result.finished_at >= result.started_at  # (a fake clock here)
    assert [c.node_id for c in culprits(result, PLANS["quick"])] == ["n3"]
