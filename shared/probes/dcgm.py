"""DCGM active diagnostics (``dcgmi diag -r N -j``) to a DcgmDiagFailed condition.

dcgmi can hang on a faulty GPU, so it always runs under a timeout and a timeout counts as a
FAILED check (status true, reason "timeout"), not as "could not check": a diagnostic that
never finishes is itself the symptom. Output follows the documented JSON shape::

    {"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Hardware", "tests": [
            {"name": "GPU Memory", "results": [{"gpu_ids": "0", "status": "FAIL",
                                                "warnings": [...]}]}]}],
     "version": "..."}}

Statuses are PASS|FAIL|WARN|SKIP(PED) in any case; warnings are strings (older DCGM) or
objects with ``warning``/``error_id`` (newer). There is no published stable schema, so the
parser only relies on ``test_categories``/``tests``/``results``/``status`` and never on position.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.domain.health import Condition, ConditionType
from shared.probes.commands import CommandTimedOut, ProbeError, Runner
from shared.probes.conditions import healthy, problem

CTYPE = ConditionType.DCGM_DIAG_FAILED.value


class DcgmParseError(ProbeError):
    pass


@dataclass(frozen=True)
class DiagResult:
    failed_tests: tuple[str, ...]
    warned_tests: tuple[str, ...] = ()
    tests_run: int = 0
    failed_gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    messages: tuple[str, ...] = ()
    version: str = ""


def parse_dcgm_diag_json(text: str) -> DiagResult:
    """Parse ``dcgmi diag -j`` output; DcgmParseError with a reason on anything else."""
    if not text or not text.strip():
        raise DcgmParseError("dcgmi printed nothing")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise DcgmParseError(f"dcgmi output is not JSON: {exc}") from exc
    body = _find_body(doc)
    if body is None:
        raise DcgmParseError("dcgmi JSON has no test_categories")
    failed: list[str] = []
    warned: list[str] = []
    failed_gpus: dict[str, tuple[str, ...]] = {}
    messages: list[str] = []
    tests_run = 0
    categories = body.get("test_categories")
    if not isinstance(categories, list):
        raise DcgmParseError("dcgmi JSON test_categories is not a list")
    for category in categories:
        if not isinstance(category, Mapping):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, Mapping):
                continue
            name = str(test.get("name") or "?")
            statuses: list[str] = []
            gpus: list[str] = []
            for result in test.get("results") or []:
                if not isinstance(result, Mapping):
                    continue
                status = str(result.get("status", "")).strip().upper()
                statuses.append(status)
                if status == "FAIL":
                    gpus.append(str(result.get("gpu_ids", result.get("entity_id", "?"))))
                    messages.extend(_warnings(result))
            if not statuses:
                continue
            tests_run += 1
            if "FAIL" in statuses:
                failed.append(name)
                failed_gpus[name] = tuple(gpus)
            elif "WARN" in statuses or "WARNING" in statuses:
                warned.append(name)
    return DiagResult(
        failed_tests=tuple(failed),
        warned_tests=tuple(warned),
        tests_run=tests_run,
        failed_gpus=failed_gpus,
        messages=tuple(messages[:20]),
        version=str(body.get("version", "")),
    )


def _find_body(doc: Any) -> Mapping[str, Any] | None:
    """The object holding test_categories, whatever the top-level key is called this release."""
    if not isinstance(doc, Mapping):
        return None
    if "test_categories" in doc:
        return doc
    for value in doc.values():
        if isinstance(value, Mapping) and "test_categories" in value:
            return value
    return None


def _warnings(result: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for warning in result.get("warnings") or []:
        if isinstance(warning, Mapping):
            out.append(str(warning.get("warning", warning)))
        else:
            out.append(str(warning))
    return out


def diag_condition(result: DiagResult, level: int, now: float) -> Condition:
    details: dict[str, Any] = {
        "level": level,
        "failed_tests": list(result.failed_tests),
        "warned_tests": list(result.warned_tests),
        "tests_run": result.tests_run,
    }
    if result.failed_tests:
        details["failed_gpus"] = {k: list(v) for k, v in result.failed_gpus.items()}
        details["messages"] = list(result.messages)
        reason = f"dcgmi diag -r {level} failed: {', '.join(result.failed_tests)}"
        return problem(CTYPE, now, reason, details)
    if result.tests_run == 0:
        raise DcgmParseError("dcgmi JSON reports no test results")
    return healthy(CTYPE, now, f"dcgmi diag -r {level} passed {result.tests_run} tests", details)


def probe(
    runner: Runner, now: float, *, tool: str = "dcgmi", level: int = 1, timeout_s: float = 120.0
) -> Condition:
    """Run the diagnostic. Timeout: failed (true). Missing tool or garbage: ProbeError."""
    try:
        result = runner([tool, "diag", "-r", str(level), "-j"], timeout_s)
    except CommandTimedOut:
        # No "level": the run never reported which tests fail, and triage reads a missing level
        # as "diagnostic hung" (cheapest node action) rather than as a level-N test failure.
        details = {"requested_level": level, "failed_tests": [], "timeout_s": timeout_s, "timed_out": True}
        return problem(CTYPE, now, "timeout", details)
    # dcgmi exits non-zero when a test fails but still prints the JSON: parse first.
    try:
        parsed = parse_dcgm_diag_json(result.stdout)
    except DcgmParseError:
        if result.returncode != 0:
            tail = (result.stderr.strip() or result.stdout.strip())[-200:]
            raise ProbeError(f"dcgmi exited {result.returncode}: {tail}") from None
        raise
    return diag_condition(parsed, level, now)
