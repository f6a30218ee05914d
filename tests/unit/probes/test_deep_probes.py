"""The deep checks' probes on recorded-format outputs (no GPU here: fixtures follow the
documented formats, see tests/fixtures/SOURCES.md): all_reduce_perf tables and dcgmi diag -r 3."""

from __future__ import annotations

import pytest

from shared.domain.health import ConditionStatus
from shared.probes import dcgm, nccl
from shared.probes.commands import CommandTimedOut, ProbeError, ToolNotFound
from tests.recorded import fixture_text
from tests.unit.probes.fakes import FakeRunner, ok

NOW = 1_796_000_000.0
ARGV = ["srun", "--reservation=mtc-deep-n1", "all_reduce_perf", "-b", "8", "-e", "8G"]


def test_a_two_node_pass_reads_busbw_at_the_largest_size() -> None:
    result = nccl.parse_all_reduce_perf(fixture_text("nccl/all_reduce_perf_2node_pass.txt"))
    assert len(result.rows) == 31 and result.largest.size_bytes == 8589934592
    assert result.busbw_gbps == pytest.approx(362, abs=2)
    assert result.avg_busbw is not None and result.avg_busbw < result.busbw_gbps / 2  # small sizes
    assert result.wrong == 0 and result.out_of_bounds == 0
    cond = nccl.bandwidth_condition(result, 300.0, NOW)
    assert cond.status is ConditionStatus.FALSE and cond.details["ratio_to_threshold"] > 1


def test_low_bandwidth_is_a_problem_with_its_numbers() -> None:
    result = nccl.parse_all_reduce_perf(fixture_text("nccl/all_reduce_perf_2node_slow.txt"))
    cond = nccl.bandwidth_condition(result, 300.0, NOW)
    assert cond.status is ConditionStatus.TRUE and cond.type == "CollectiveBandwidthLow"
    assert cond.details["busbw_gbps"] == pytest.approx(46.6, abs=0.1)
    assert cond.details["corrupt"] is False and "below 300" in cond.reason


def test_wrong_values_are_corruption_whatever_the_speed() -> None:
    result = nccl.parse_all_reduce_perf(fixture_text("nccl/all_reduce_perf_2node_wrong.txt"))
    assert result.busbw_gbps > 300 and result.out_of_bounds == 90
    cond = nccl.bandwidth_condition(result, 300.0, NOW)
    assert cond.status is ConditionStatus.TRUE and cond.details["corrupt"] is True
    assert result.wrong == 2 * (3 + 6 + 12 + 24) == 90  # both columns


def test_the_older_layout_is_found_by_column_names() -> None:
    result = nccl.parse_all_reduce_perf(fixture_text("nccl/all_reduce_perf_1node_legacy.txt"))
    assert result.largest.size_bytes == 1073741824 and result.wrong == 0  # N/A: not counted
    assert result.busbw_gbps == pytest.approx(480, rel=0.05)


def test_probe_outcomes_pass_fail_timeout_unknown() -> None:
    table = fixture_text("nccl/all_reduce_perf_2node_pass.txt")
    passed = nccl.probe(FakeRunner({"srun": ok(table)}), NOW, ARGV, min_busbw_gbps=300.0,
                        nodes=["n1", "n2"])
    assert passed.status is ConditionStatus.FALSE and passed.details["nodes"] == ["n1", "n2"]

    error = fixture_text("nccl/all_reduce_perf_nccl_error.txt")
    failed = nccl.probe(FakeRunner({"srun": ok(error, returncode=1)}), NOW, ARGV,
                        min_busbw_gbps=300.0)
    assert failed.status is ConditionStatus.TRUE and "unhandled system error" in failed.reason

    def hang(argv: object) -> object:
        raise CommandTimedOut("srun", 600)

    hung = nccl.probe(FakeRunner({"srun": hang}), NOW, ARGV, min_busbw_gbps=300.0)  # type: ignore[dict-item]
    assert hung.status is ConditionStatus.TRUE and hung.reason == "timeout"

    with pytest.raises(ToolNotFound):  # the caller turns this into unknown
        nccl.probe(FakeRunner({}), NOW, ARGV, min_busbw_gbps=300.0)
    with pytest.raises(ProbeError, match="no result table"):
        nccl.probe(FakeRunner({"srun": ok("srun: error: Unable to allocate\n", 1)}), NOW, ARGV,
                   min_busbw_gbps=300.0)
    no_threshold = nccl.probe(FakeRunner({"srun": ok(table)}), NOW, ARGV, min_busbw_gbps=None)
    assert no_threshold.status is ConditionStatus.UNKNOWN


def test_dcgm_level_3_pass_counts_its_stress_tests() -> None:
    runner = FakeRunner({"dcgmi": ok(fixture_text("dcgm/dcgmi_diag_r3_pass.json"))})
    cond = dcgm.probe(runner, NOW, level=3, timeout_s=3600)
    assert runner.calls[0][0] == ("dcgmi", "diag", "-r", "3", "-j")
    assert cond.status is ConditionStatus.FALSE and cond.details["level"] == 3
    assert cond.details["tests_run"] == 16


def test_dcgm_level_2_failure_names_the_tests_and_level() -> None:
    runner = FakeRunner({"dcgmi": ok(fixture_text("dcgm/dcgmi_diag_r2_fail.json"), 226)})
    cond = dcgm.probe(runner, NOW, level=2)
    assert cond.status is ConditionStatus.TRUE and cond.details["level"] == 2
    assert "GPU Memory" in cond.details["failed_tests"]
