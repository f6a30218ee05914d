from __future__ import annotations

import json
import time

import pytest

from shared.domain.health import ConditionStatus
from shared.probes.commands import ProbeError, run_command
from shared.probes.dcgm import DcgmParseError, diag_condition, parse_dcgm_diag_json, probe
from tests.recorded import fixture_text
from tests.unit.probes.fakes import FakeRunner, ok

NOW = 1_796_000_000.0


def test_level_1_pass() -> None:
    result = parse_dcgm_diag_json(fixture_text("dcgm/dcgmi_diag_r1_pass.json"))
    assert result.failed_tests == () and result.tests_run == 10
    assert result.version == "3.3.5"
    cond = diag_condition(result, 1, NOW)
    assert cond.status is ConditionStatus.FALSE
    assert cond.details["level"] == 1 and cond.details["failed_tests"] == []


def test_level_2_fail() -> None:
    result = parse_dcgm_diag_json(fixture_text("dcgm/dcgmi_diag_r2_fail.json"))
    assert result.failed_tests == ("Page Retirement/Row Remap", "GPU Memory")
    assert result.warned_tests == ("PCIe",)
    assert result.failed_gpus["GPU Memory"] == ("1",)
    cond = diag_condition(result, 2, NOW)
    assert cond.status is ConditionStatus.TRUE
    assert cond.details["level"] == 2
    assert cond.details["failed_tests"] == ["Page Retirement/Row Remap", "GPU Memory"]
    assert any("double-bit ECC" in m for m in cond.details["messages"])
    assert cond.reason == "dcgmi diag -r 2 failed: Page Retirement/Row Remap, GPU Memory"


def test_legacy_upper_case_statuses_and_string_warnings() -> None:
    result = parse_dcgm_diag_json(fixture_text("dcgm/dcgmi_diag_r1_fail_legacy.json"))
    assert result.failed_tests == ("Persistence Mode",)
    assert "Persistence mode for GPU 2" in result.messages[0]


def test_newer_entity_shape_under_another_top_level_key() -> None:
    doc = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Hardware",
                    "tests": [
                        {
                            "name": "memory",
                            "results": [
                                {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                                {"entity_group": "GPU", "entity_id": 3, "status": "Fail"},
                            ],
                        }
                    ],
                }
            ]
        }
    }
    result = parse_dcgm_diag_json(json.dumps(doc))
    assert result.failed_tests == ("memory",)
    assert result.failed_gpus["memory"] == ("3",)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "printed nothing"),
        ("Error: unable to establish a connection to the specified host: localhost", "not JSON"),
        ("[1, 2, 3]", "no test_categories"),
        ('{"DCGM GPU Diagnostic": {"test_categories": "nope"}}', "not a list"),
        ('{"DCGM GPU Diagnostic": {"test_categories": [{"tests": [7, null]}]}}', None),
    ],
)
def test_garbage(text: str, reason: str | None) -> None:
    if reason is None:  # structurally valid but no results: cannot say "passed"
        with pytest.raises(DcgmParseError, match="no test results"):
            diag_condition(parse_dcgm_diag_json(text), 1, NOW)
        return
    with pytest.raises(DcgmParseError, match=reason):
        parse_dcgm_diag_json(text)


def test_probe_parses_json_even_when_dcgmi_exits_nonzero() -> None:
    runner = FakeRunner({"dcgmi": ok(fixture_text("dcgm/dcgmi_diag_r2_fail.json"), returncode=226)})
    cond = probe(runner, NOW, level=2, timeout_s=300.0)
    assert cond.status is ConditionStatus.TRUE
    assert runner.calls == [(("dcgmi", "diag", "-r", "2", "-j"), 300.0)]


def test_probe_hostengine_down_is_a_probe_error() -> None:
    stderr = "Error: unable to establish a connection to the specified host: localhost"
    runner = FakeRunner({"dcgmi": ok("", returncode=255, stderr=stderr)})
    with pytest.raises(ProbeError, match="exited 255: Error: unable to establish"):
        probe(runner, NOW)


def test_timeout_is_a_failed_check(sleeper: str) -> None:
    start = time.monotonic()
    cond = probe(run_command, NOW, tool=sleeper, level=3, timeout_s=0.2)
    assert time.monotonic() - start < 3.0
    assert cond.status is ConditionStatus.TRUE
    assert cond.reason == "timeout"
    assert cond.details == {"requested_level": 3, "failed_tests": [], "timeout_s": 0.2, "timed_out": True}


def test_missing_dcgmi() -> None:
    with pytest.raises(ProbeError, match="dcgmi-does-not-exist not found on PATH"):
        probe(run_command, NOW, tool="dcgmi-does-not-exist")
