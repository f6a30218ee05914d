"""Fair share in the twin (the ``teams`` scenario): team a borrows b's idle nodes, b takes
its quota back by preemption on day 2 (a's lost time counted under the cause ``preemption``,
not as a failure), and the per-team figures and a quota sweep say how each team fared."""

from __future__ import annotations

import pytest

from simulator import twin
from simulator.readers import ScenarioError
from simulator.scenario import load_scenario
from simulator.sweep import run_task, tasks
from simulator.team_queues import team_figures


def test_b_reclaims_its_quota_from_a_by_preemption() -> None:
    result = twin.run(load_scenario("teams"), seed=11)
    jobs = result.accounting.jobs
    assert jobs["a-train"].interruptions().get("preemption", 0) >= 1
    # a-eval (8 nodes, lower priority) is tried first, but a-train alone gives b its 16
    assert "preemption" not in jobs["a-eval"].interruptions()
    assert "preemption" not in jobs["b-train"].interruptions()
    assert result.job_states["b-train"] == "JOB_STATE_SUCCEEDED"
    assert jobs["b-train"].scheduling_goodput > 0.99  # b waited for no one
    figures = team_figures(result.scenario.jobs, jobs)
    assert figures["a"]["preemption_h"] > 0.0 and figures["b"]["preemption_h"] == 0.0
    assert figures["b"]["waiting_h"] < 0.1 < figures["a"]["waiting_h"]


def test_without_b_quota_b_waits_and_nothing_is_preempted() -> None:
    (task,) = tasks("teams", [("cluster.queues.1.nominal", ["8"])], 1, 11)
    row = run_task(task)
    assert row["preemption_h_a"] == 0.0 and row["waiting_h_b"] > 24.0
    assert {"goodput_a", "goodput_b", "waiting_h_a"} <= set(row)


def test_quotas_above_the_partition_are_refused_by_path() -> None:
    with pytest.raises(ScenarioError, match=r"cluster\.queues\[1\]\.nominal: "):
        load_scenario("teams", {"cluster.queues.1.nominal": 20})
