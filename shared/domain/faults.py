"""What an injected health fault may say: one set of rules for every entry point.

``mtc node fault`` (and any later one, e.g. an API route) builds a :class:`FaultRequest` and
calls :func:`validate_fault` and :func:`check_fault_target` before anything is injected, so
a fault no GPU node could report (a negative ECC count, a disk 500 % full, a node "faster
than its baseline" that would then be replaced, an XID on the login node) is refused with a
:class:`~shared.domain.errors.ValidationError` naming the offending field, and nothing is
injected. Field names are the caller's: ``names`` maps each field of FaultRequest to what
its user typed (``--ecc-dbe``; a JSON field), so the error names the option.

Ranges: XID codes are NVIDIA's (docs.nvidia.com/deploy/xid-errors), 1 to 200 (the catalog
ends in the 170s; shared/policies/data/triage_table.v1.yaml maps codes up to 161 and
handles an unknown code in range as ``unmapped_xid``); a DCGM diagnostic level is 1 to 4;
a temperature is a GPU's, 0 to 150 C; disk use is a fraction of the disk, 0 to 1; a slow
speed check is a ratio to the node's baseline, above 0 and at most 1 (above 1 is faster
than baseline: not slow). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shared.domain.errors import NotFound, ValidationError
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.domain.model import Node, NodeRole, NodeState

XID_MIN, XID_MAX = 1, 200
DCGM_LEVELS = (1, 2, 3, 4)
THERMAL_MIN_C, THERMAL_MAX_C = 0.0, 150.0


@dataclass(frozen=True)
class FaultRequest:
    """The faults to inject on one node; None (or empty, or False) means "not this one"."""

    xids: tuple[int, ...] = ()
    ecc_dbe: int | None = None  # volatile double-bit ECC errors
    row_remap_failure: bool = False
    dcgm_level: int | None = None  # the DCGM diagnostic level that failed
    thermal_c: float | None = None
    disk_used_fraction: float | None = None
    slow_ratio: float | None = None  # speed check result as a ratio to baseline

    @property
    def empty(self) -> bool:
        return not (self.xids or self.row_remap_failure) and all(
            v is None for v in (self.ecc_dbe, self.dcgm_level, self.thermal_c,
                                self.disk_used_fraction, self.slow_ratio))


def _integer(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(name, f"must be an integer, got {value!r}")
    return value


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        raise ValidationError(name, f"must be a finite number, got {value!r}")
    return float(value)


def validate_fault(fault: FaultRequest, names: Mapping[str, str] | None = None
                   ) -> FaultRequest:
    """``fault`` if every value in it is one a node agent could report, else a
    ValidationError naming the first bad field (as ``names`` spells it)."""
    def name(f: str) -> str:
        return (names or {}).get(f, f)

    for code in fault.xids:
        if not XID_MIN <= _integer(code, name("xids")) <= XID_MAX:
            raise ValidationError(name("xids"), f"an NVIDIA XID code is {XID_MIN} to "
                                  f"{XID_MAX}, got {code}")
    if fault.ecc_dbe is not None:
        count = _integer(fault.ecc_dbe, name("ecc_dbe"))
        if count < 0:
            raise ValidationError(name("ecc_dbe"), f"an error count is 0 or more, got {count}")
        if count == 0:
            raise ValidationError(name("ecc_dbe"), "0 errors is no fault: give 1 or more")
    if fault.dcgm_level is not None and _integer(fault.dcgm_level, name("dcgm_level")) \
            not in DCGM_LEVELS:
        raise ValidationError(name("dcgm_level"), f"a DCGM diagnostic level is 1 to 4, got "
                              f"{fault.dcgm_level}")
    if fault.thermal_c is not None:
        c = _number(fault.thermal_c, name("thermal_c"))
        if not THERMAL_MIN_C <= c <= THERMAL_MAX_C:
            raise ValidationError(name("thermal_c"), f"a GPU temperature is {THERMAL_MIN_C:g} "
                                  f"to {THERMAL_MAX_C:g} C, got {c:g}")
    if fault.disk_used_fraction is not None:
        used = _number(fault.disk_used_fraction, name("disk_used_fraction"))
        if not 0.0 <= used <= 1.0:
            raise ValidationError(name("disk_used_fraction"), "the used fraction of the disk "
                                  f"is 0 to 1 (0.97 is 97 %), got {used:g}")
    if fault.slow_ratio is not None:
        ratio = _number(fault.slow_ratio, name("slow_ratio"))
        if not 0.0 < ratio <= 1.0:
            raise ValidationError(name("slow_ratio"), "a speed check is a ratio to the "
                                  "node's baseline, above 0 and at most 1 (0.5 is half as "
                                  f"fast; above 1 is not slow), got {ratio:g}")
    return fault


def check_fault_target(node: Node | None, node_id: str, name: str = "node_id") -> Node:
    """The node a fault may be injected on: one that exists, is a worker (a GPU node: the
    login node has no GPUs to fault) and is not retired."""
    if node is None:
        raise NotFound("node", node_id)
    if node.role is not NodeRole.WORKER:
        raise ValidationError(name, f"{node_id} is the {node.role.value} node, not a worker: "
                              "GPU faults happen on worker nodes")
    if node.state is NodeState.RETIRED:
        raise ValidationError(name, f"{node_id} is retired: it is gone and reports nothing")
    return node


def fault_conditions(fault: FaultRequest, now: float) -> list[Condition]:
    """The conditions a node agent would report for ``fault`` (one validate_fault passed)."""
    f, T, TRUE = fault, ConditionType, ConditionStatus.TRUE
    out = []
    if f.xids:
        out.append(Condition(T.XID_ERROR.value, TRUE, f"NVRM: Xid {list(f.xids)}", now,
                             {"xids": list(f.xids)}))
    if f.ecc_dbe is not None:
        out.append(Condition(T.ECC_UNCORRECTABLE.value, TRUE, f"{f.ecc_dbe} volatile DBE",
                             now, {"volatile_dbe": f.ecc_dbe, "aggregate_dbe": f.ecc_dbe}))
    if f.row_remap_failure:
        out.append(Condition(T.ROW_REMAP_FAILURE.value, TRUE, "row remapping failed", now,
                             {"failure": True, "pending": False}))
    if f.dcgm_level is not None:
        out.append(Condition(T.DCGM_DIAG_FAILED.value, TRUE, f"dcgmi diag -r {f.dcgm_level}",
                             now, {"level": f.dcgm_level, "failed_tests": ["memory"]}))
    if f.thermal_c is not None:
        out.append(Condition(T.THERMAL_THROTTLING.value, TRUE, f"{f.thermal_c} C", now,
                             {"temperature_c": f.thermal_c,
                              "reasons": ["hw_thermal_slowdown"]}))
    if f.disk_used_fraction is not None:
        out.append(Condition(T.DISK_PRESSURE.value, TRUE, f"{f.disk_used_fraction:.0%} used",
                             now, {"mount": "/", "used_fraction": f.disk_used_fraction}))
    if f.slow_ratio is not None:
        out.append(Condition(T.SLOW_SPEED_CHECK.value, TRUE, f"{f.slow_ratio:.2f}x baseline",
                             now, {"ratio_to_baseline": f.slow_ratio}))
    return out
