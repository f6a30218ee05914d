"""The GPU preflight over recorded tool output: dcgmi per node and all_reduce_perf over the
gang and its ring pairs, judged by the same policy; the node whose every pair is slow (or
whose DCGM level fails) is the culprit, a tool that could not run is no failure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shared.adapters.compute.preflight_nccl import Launch, NcclPreflight
from shared.policies.preflight import PLANS, culprits
from shared.ports import Preflight
from shared.probes.commands import CommandResult, Runner, ToolNotFound
from tests.recorded import fixture_text

PLAN = replace(PLANS["thorough"], min_busbw_gbps=300.0)  # an H100 fabric's floor


def launcher(slow: str = "", sick: str = "", no_dcgmi: bool = False,
             wrong: str = "") -> tuple[list[tuple[tuple[str, ...], str]], Launch]:
    calls: list[tuple[tuple[str, ...], str]] = []

    def launch(nodes: Sequence[str]) -> Runner:
        def run(argv: Sequence[str], timeout_s: float) -> CommandResult:
            calls.append((tuple(nodes), argv[0]))
            if argv[0] == "dcgmi":
                if no_dcgmi:
                    raise ToolNotFound("dcgmi")
                name = "dcgmi_diag_r2_fail.json" if sick in nodes else "dcgmi_diag_r3_pass.json"
                return CommandResult(tuple(argv), 0, fixture_text(f"dcgm/{name}"), "")
            name = ("slow" if slow in nodes else "wrong" if wrong in nodes else "pass")
            text = fixture_text(f"nccl/all_reduce_perf_2node_{name}.txt")
            return CommandResult(tuple(argv), 0, text, "")
        return run

    return calls, launch


def test_the_node_on_every_slow_pair_is_named_and_each_node_gets_dcgm() -> None:
    calls, launch = launcher(slow="n2")
    runner = NcclPreflight(launch)
    assert isinstance(runner, Preflight)
    result = runner.run_preflight("j1", ["n0", "n1", "n2"], PLAN)
    assert [c.node_id for c in culprits(result, PLAN)] == ["n2"]
    assert sorted(n for n, tool in calls if tool == "dcgmi") == [("n0",), ("n1",), ("n2",)]
    groups = [n for n, tool in calls if tool == "all_reduce_perf"]
    assert groups[0] == ("n0", "n1", "n2") and len(groups) == 4  # the gang, then 3 pairs


def test_a_failed_dcgm_level_or_wrong_values_name_the_node() -> None:
    _, launch = launcher(sick="n1")
    result = NcclPreflight(launch).run_preflight("j1", ["n0", "n1", "n2"], PLAN)
    assert [(c.node_id, c.collective) for c in culprits(result, PLAN)] == [("n1", False)]
    _, launch = launcher(wrong="n0")
    result = NcclPreflight(launch).run_preflight("j1", ["n0", "n1", "n2"], PLAN)
    named = culprits(result, PLAN)
    assert [c.node_id for c in named] == ["n0"] and named[0].corrupt


def test_a_missing_dcgmi_is_no_failure() -> None:
    _, launch = launcher(no_dcgmi=True)
    result = NcclPreflight(launch).run_preflight("j1", ["n0", "n1"], PLAN)
    assert culprits(result, PLAN) == ()
    assert all(c.ok and c.reason.startswith("unknown") for c in result.node_checks)
