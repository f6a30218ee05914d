from __future__ import annotations

import time

import pytest

from shared.domain.health import Condition, ConditionStatus
from shared.probes.commands import CommandTimedOut, ProbeError, run_command
from shared.probes.nvidia_smi import (
    NvidiaSmiParseError,
    conditions_from_readings,
    parse_nvidia_smi_xml,
    probe,
)
from tests.recorded import fixture_text
from tests.unit.probes.fakes import FakeRunner, ok

NOW = 1_796_000_000.0
T, F, U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def by_type(conditions: list[Condition]) -> dict[str, Condition]:
    return {c.type: c for c in conditions}


def test_healthy_h100() -> None:
    readings = parse_nvidia_smi_xml(fixture_text("nvidia_smi/h100_healthy.xml"))
    assert [r.gpu for r in readings] == ["00000000:18:00.0", "00000000:3B:00.0"]
    first = readings[0]
    assert first.product_name == "NVIDIA H100 80GB HBM3"
    assert (first.volatile_dbe, first.aggregate_dbe, first.aggregate_sbe) == (0, 0, 3)
    assert (first.remap_failure, first.remap_pending) == (False, False)
    assert (first.temperature_c, first.slowdown_threshold_c) == (54.0, 90.0)
    assert first.clocks_mhz["sm_clock"] == 1980.0
    assert first.throttle_reported and first.active_throttle_reasons == ()
    conds = by_type(conditions_from_readings(readings, NOW))
    assert {c.status for c in conds.values()} == {F}
    assert conds["EccUncorrectable"].details["volatile_dbe"] == 0


def test_h100_with_dbe_remap_failure_and_thermal_slowdown() -> None:
    readings = parse_nvidia_smi_xml(fixture_text("nvidia_smi/h100_dbe_remap_thermal.xml"))
    bad = readings[1]
    # The split SRAM layout (parity + secded) and DRAM counts are summed.
    assert (bad.volatile_dbe, bad.aggregate_dbe, bad.volatile_sbe) == (2, 7, 53)
    assert bad.remap_failure is True and bad.remapped_rows_uncorrectable == 7
    assert set(bad.active_throttle_reasons) == {"hw_slowdown", "hw_thermal_slowdown"}
    conds = by_type(conditions_from_readings(readings, NOW))
    ecc = conds["EccUncorrectable"]
    assert ecc.status is T
    assert ecc.details["volatile_dbe"] == 2 and ecc.details["aggregate_dbe"] == 7
    assert ecc.details["gpus"] == ["00000000:3B:00.0"]
    remap = conds["RowRemapFailure"]
    assert remap.status is T and remap.details["failure"] is True and remap.details["pending"] is False
    thermal = conds["ThermalThrottling"]
    assert thermal.status is T
    assert thermal.details["temperature_c"] == 93.0
    assert thermal.details["reasons"] == [
        "hw_slowdown",
        "hw_thermal_slowdown",
        "temperature_over_slowdown_threshold",
    ]
    assert thermal.details["gpus"] == ["00000000:3B:00.0"]


def test_a100_legacy_layout() -> None:
    (reading,) = parse_nvidia_smi_xml(fixture_text("nvidia_smi/a100_legacy_r470.xml"))
    assert (reading.volatile_sbe, reading.volatile_dbe) == (4, 0)
    assert (reading.aggregate_sbe, reading.aggregate_dbe) == (96, 1)
    assert reading.active_throttle_reasons == ("sw_thermal_slowdown",)  # sw_power_cap ignored
    assert reading.clocks_mhz == {
        "graphics_clock": 1275.0,
        "sm_clock": 1275.0,
        "mem_clock": 1215.0,
        "video_clock": 1110.0,
    }
    conds = by_type(conditions_from_readings([reading], NOW))
    # An old (aggregate) DBE with none since driver load is history, not a current problem.
    assert conds["EccUncorrectable"].status is F
    assert conds["EccUncorrectable"].details["aggregate_dbe"] == 1
    remap = conds["RowRemapFailure"]
    assert remap.status is T and remap.details == {
        "failure": False,
        "pending": True,
        "gpus": ["00000000:07:00.0"],
    }
    assert conds["ThermalThrottling"].details["reasons"] == ["sw_thermal_slowdown"]


def test_gpu_without_ecc_or_remapping_is_unknown_not_healthy() -> None:
    conds = by_type(
        conditions_from_readings(parse_nvidia_smi_xml(fixture_text("nvidia_smi/geforce_no_ecc.xml")), NOW)
    )
    assert conds["EccUncorrectable"].status is U
    assert "ECC" in conds["EccUncorrectable"].reason
    assert conds["RowRemapFailure"].status is U
    assert conds["ThermalThrottling"].status is F


def test_no_gpus_is_unknown() -> None:
    xml = "<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>"
    conds = conditions_from_readings(parse_nvidia_smi_xml(xml), NOW)
    assert len(conds) == 3
    assert all(c.status is U and c.reason == "nvidia-smi reported no GPUs" for c in conds)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "printed nothing"),
        ("   \n", "printed nothing"),
        ("No devices were found", "not valid XML"),
        ("<nvidia_smi_log><gpu id='x'>", "not valid XML"),
        ("<html><body>oops</body></html>", "unexpected XML root"),
        ("\x00\x01\x02binary", "not valid XML"),
    ],
)
def test_garbage_raises_parse_error_with_reason(text: str, reason: str) -> None:
    with pytest.raises(NvidiaSmiParseError, match=reason):
        parse_nvidia_smi_xml(text)


def test_odd_values_are_none_not_zero() -> None:
    xml = """<nvidia_smi_log><gpu id="00000000:01:00.0"><ecc_errors><volatile>
    <dram_uncorrectable>N/A</dram_uncorrectable><sram_uncorrectable>lots</sram_uncorrectable>
    </volatile></ecc_errors><temperature><gpu_temp>N/A</gpu_temp></temperature></gpu></nvidia_smi_log>"""
    (reading,) = parse_nvidia_smi_xml(xml)
    assert reading.volatile_dbe is None and reading.temperature_c is None
    conds = by_type(conditions_from_readings([reading], NOW))
    assert conds["EccUncorrectable"].status is U
    assert conds["ThermalThrottling"].status is U


def test_probe_runs_nvidia_smi_q_x_with_timeout() -> None:
    runner = FakeRunner({"nvidia-smi": ok(fixture_text("nvidia_smi/h100_healthy.xml"))})
    conds = probe(runner, NOW, timeout_s=12.0)
    assert [c.type for c in conds] == ["EccUncorrectable", "RowRemapFailure", "ThermalThrottling"]
    assert runner.calls == [(("nvidia-smi", "-q", "-x"), 12.0)]


def test_probe_driver_failure_is_a_probe_error() -> None:
    message = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    runner = FakeRunner({"nvidia-smi": ok(message, returncode=9)})
    with pytest.raises(ProbeError, match="exited 9: NVIDIA-SMI has failed"):
        probe(runner, NOW)


def test_probe_hang_times_out(sleeper: str) -> None:
    start = time.monotonic()
    with pytest.raises(CommandTimedOut, match=r"timed out after 0\.2s"):
        probe(run_command, NOW, tool=sleeper, timeout_s=0.2)
    assert time.monotonic() - start < 3.0
