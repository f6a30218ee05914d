"""``nvidia-smi -q -x`` XML to per-GPU readings, and readings to conditions.

The XML layout changed across driver branches, so each reading looks in every place it has
lived: ECC counts as ``single_bit``/``double_bit`` totals (R4xx, A100 era) or as
``sram_*``/``dram_*`` counters (R535+, with ``sram_uncorrectable`` later split into
``_parity``/``_secded``); throttle reasons under ``clocks_throttle_reasons`` (older) or
``clocks_event_reasons`` (R535+). A value of ``N/A`` means "not reported" (None), never 0.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.domain.health import Condition, ConditionType
from shared.probes.commands import ProbeError, Runner
from shared.probes.conditions import healthy, problem, unknown

THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")
_NUMBER_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class GpuReading:
    gpu: str  # PCI bus id, e.g. "00000000:3B:00.0"
    product_name: str = ""
    uuid: str = ""
    volatile_sbe: int | None = None
    volatile_dbe: int | None = None
    aggregate_sbe: int | None = None
    aggregate_dbe: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    temperature_c: float | None = None
    slowdown_threshold_c: float | None = None
    active_throttle_reasons: tuple[str, ...] = ()
    throttle_reported: bool = False
    clocks_mhz: dict[str, float] = field(default_factory=dict)


class NvidiaSmiParseError(ProbeError):
    pass


def parse_nvidia_smi_xml(text: str) -> list[GpuReading]:
    """Parse the whole document; raise NvidiaSmiParseError (with a reason) on garbage."""
    if not text or not text.strip():
        raise NvidiaSmiParseError("nvidia-smi printed nothing")
    # The DOCTYPE names an external DTD; ElementTree never fetches it, so it is harmless.
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise NvidiaSmiParseError(f"nvidia-smi output is not valid XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiParseError(f"unexpected XML root <{root.tag}>, want <nvidia_smi_log>")
    return [_parse_gpu(gpu) for gpu in root.findall("gpu")]


def _parse_gpu(gpu: ET.Element) -> GpuReading:
    volatile_sbe, volatile_dbe = _ecc_counts(gpu.find("ecc_errors/volatile"))
    aggregate_sbe, aggregate_dbe = _ecc_counts(gpu.find("ecc_errors/aggregate"))
    remap = gpu.find("remapped_rows")
    reasons, reported = _throttle(gpu)
    clocks: dict[str, float] = {}
    for clock in gpu.findall("clocks/*"):
        value = _number(clock.text)
        if value is not None:
            clocks[clock.tag] = value
    return GpuReading(
        gpu=gpu.get("id") or _text(gpu, "pci/pci_bus_id") or "?",
        product_name=_text(gpu, "product_name"),
        uuid=_text(gpu, "uuid"),
        volatile_sbe=volatile_sbe,
        volatile_dbe=volatile_dbe,
        aggregate_sbe=aggregate_sbe,
        aggregate_dbe=aggregate_dbe,
        remapped_rows_correctable=_int(remap, "remapped_row_corr"),
        remapped_rows_uncorrectable=_int(remap, "remapped_row_unc"),
        remap_pending=_yes_no(remap, "remapped_row_pending"),
        remap_failure=_yes_no(remap, "remapped_row_failure"),
        temperature_c=_number(_text(gpu, "temperature/gpu_temp")),
        slowdown_threshold_c=_number(_text(gpu, "temperature/gpu_temp_slow_threshold")),
        active_throttle_reasons=reasons,
        throttle_reported=reported,
        clocks_mhz=clocks,
    )


def _ecc_counts(section: ET.Element | None) -> tuple[int | None, int | None]:
    """(correctable, uncorrectable) from either ECC layout; None where not reported."""
    if section is None:
        return None, None
    if section.find("single_bit") is not None or section.find("double_bit") is not None:
        return _int(section, "single_bit/total"), _int(section, "double_bit/total")
    correctable = _sum(_int(section, "sram_correctable"), _int(section, "dram_correctable"))
    sram_unc = _int(section, "sram_uncorrectable")
    if sram_unc is None:
        sram_unc = _sum(
            _int(section, "sram_uncorrectable_parity"), _int(section, "sram_uncorrectable_secded")
        )
    return correctable, _sum(sram_unc, _int(section, "dram_uncorrectable"))


def _throttle(gpu: ET.Element) -> tuple[tuple[str, ...], bool]:
    for block_tag, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        block = gpu.find(block_tag)
        if block is None:
            continue
        active: list[str] = []
        reported = False
        for reason in THROTTLE_REASONS:
            value = _text(block, prefix + reason)
            if value and value != "N/A":
                reported = True
                if value.strip().lower() == "active":
                    active.append(reason)
        return tuple(active), reported
    return (), False


def _text(parent: ET.Element | None, path: str) -> str:
    if parent is None:
        return ""
    node = parent.find(path)
    return (node.text or "").strip() if node is not None else ""


def _number(text: str | None) -> float | None:
    match = _NUMBER_RE.match(text or "")
    return float(match.group(1)) if match else None


def _int(parent: ET.Element | None, path: str) -> int | None:
    value = _number(_text(parent, path))
    return int(value) if value is not None else None


def _yes_no(parent: ET.Element | None, path: str) -> bool | None:
    value = _text(parent, path).lower()
    if value in ("yes", "true", "active"):
        return True
    if value in ("no", "false", "not active"):
        return False
    return None


def _sum(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


# --------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class NvidiaSmiThresholds:
    volatile_dbe_max: int = 0  # more volatile DBEs than this since driver load is a problem


def conditions_from_readings(
    readings: Sequence[GpuReading], now: float, thresholds: NvidiaSmiThresholds | None = None
) -> list[Condition]:
    limits = thresholds or NvidiaSmiThresholds()
    if not readings:
        reason = "nvidia-smi reported no GPUs"
        return [unknown(ctype, now, reason) for ctype in NVIDIA_SMI_CONDITIONS]
    return [_ecc(readings, now, limits), _remap(readings, now), _thermal(readings, now)]


NVIDIA_SMI_CONDITIONS = (
    ConditionType.ECC_UNCORRECTABLE.value,
    ConditionType.ROW_REMAP_FAILURE.value,
    ConditionType.THERMAL_THROTTLING.value,
)


def _ecc(readings: Sequence[GpuReading], now: float, limits: NvidiaSmiThresholds) -> Condition:
    ctype = ConditionType.ECC_UNCORRECTABLE.value
    reporting = [r for r in readings if r.volatile_dbe is not None or r.aggregate_dbe is not None]
    if not reporting:
        return unknown(ctype, now, "ECC counts not reported (ECC disabled or unsupported)")
    volatile = sum(r.volatile_dbe or 0 for r in reporting)
    aggregate = sum(r.aggregate_dbe or 0 for r in reporting)
    bad = [r.gpu for r in reporting if (r.volatile_dbe or 0) > limits.volatile_dbe_max]
    details = {
        "volatile_dbe": volatile,
        "aggregate_dbe": aggregate,
        "volatile_sbe": sum(r.volatile_sbe or 0 for r in reporting),
        "gpus": bad,
        "unreported_gpus": [r.gpu for r in readings if r.volatile_dbe is None and r.aggregate_dbe is None],
    }
    if bad:
        return problem(ctype, now, f"{volatile} uncorrectable ECC errors on {', '.join(bad)}", details)
    return healthy(ctype, now, "no uncorrectable ECC errors since driver load", details)


def _remap(readings: Sequence[GpuReading], now: float) -> Condition:
    ctype = ConditionType.ROW_REMAP_FAILURE.value
    reporting = [r for r in readings if r.remap_failure is not None or r.remap_pending is not None]
    if not reporting:
        return unknown(ctype, now, "row remapping not reported (unsupported before Ampere)")
    failed = [r.gpu for r in reporting if r.remap_failure]
    pending = [r.gpu for r in reporting if r.remap_pending]
    details = {
        "failure": bool(failed),
        "pending": bool(pending),
        "gpus": sorted({*failed, *pending}),
    }
    if failed:
        return problem(ctype, now, f"row remapping failed on {', '.join(failed)}", details)
    if pending:
        return problem(ctype, now, f"row remap pending (reset needed) on {', '.join(pending)}", details)
    return healthy(ctype, now, "no row remap failure or pending remap", details)


def _thermal(readings: Sequence[GpuReading], now: float) -> Condition:
    ctype = ConditionType.THERMAL_THROTTLING.value
    temps = [r.temperature_c for r in readings if r.temperature_c is not None]
    if not temps and not any(r.throttle_reported for r in readings):
        return unknown(ctype, now, "neither temperature nor throttle reasons reported")
    reasons: set[str] = set()
    hot: list[str] = []
    for r in readings:
        reasons.update(r.active_throttle_reasons)
        over = (
            r.temperature_c is not None
            and r.slowdown_threshold_c is not None
            and r.temperature_c >= r.slowdown_threshold_c
        )
        if over:
            reasons.add("temperature_over_slowdown_threshold")
        if r.active_throttle_reasons or over:
            hot.append(r.gpu)
    details = {
        "temperature_c": max(temps) if temps else None,
        "reasons": sorted(reasons),
        "gpus": hot,
    }
    if hot:
        return problem(ctype, now, f"thermal/hardware slowdown on {', '.join(hot)}", details)
    return healthy(ctype, now, "no thermal or hardware slowdown", details)


# --------------------------------------------------------------------------- probe


def probe(
    runner: Runner,
    now: float,
    *,
    tool: str = "nvidia-smi",
    timeout_s: float = 30.0,
    thresholds: NvidiaSmiThresholds | None = None,
) -> list[Condition]:
    """Run ``nvidia-smi -q -x``; ProbeError (tool missing, timeout, garbage) propagates."""
    result = runner([tool, "-q", "-x"], timeout_s)
    if result.returncode != 0 and not result.stdout.strip().startswith("<"):
        tail = (result.stderr.strip() or result.stdout.strip())[-200:]
        raise ProbeError(f"nvidia-smi exited {result.returncode}: {tail}")
    return conditions_from_readings(parse_nvidia_smi_xml(result.stdout), now, thresholds)
