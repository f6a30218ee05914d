"""Health vocabulary shared by the node agent, triage, repair and the simulator.

Conditions follow node-problem-detector: each names a *problem*; status ``true`` means the
problem is present, ``false`` means the check ran and found nothing, ``unknown`` means the
check could not run (never read as healthy).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from shared.domain.errors import ValidationError
from shared.domain.validation import require_number, require_str


class ConditionStatus(enum.StrEnum):
    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"


_STATUSES = {s.value: s for s in ConditionStatus}


class ConditionType(enum.StrEnum):
    """Problem conditions a node agent reports. Details carry the numbers triage reads."""

    XID_ERROR = "XidError"  # details: {"xids": [int, ...], "gpus": [pci bus ids]}
    ECC_UNCORRECTABLE = "EccUncorrectable"  # details: {"volatile_dbe": int, "aggregate_dbe": int}
    ROW_REMAP_FAILURE = "RowRemapFailure"  # details: {"failure": bool, "pending": bool}
    DCGM_DIAG_FAILED = "DcgmDiagFailed"  # details: {"level": int, "failed_tests": [str]}
    THERMAL_THROTTLING = "ThermalThrottling"  # details: {"temperature_c": float, "reasons": [str]}
    DISK_PRESSURE = "DiskPressure"  # details: {"mount": str, "used_fraction": float}
    SLOW_SPEED_CHECK = "SlowSpeedCheck"  # details: {"ratio_to_baseline": float}
    HEARTBEAT_LOST = "HeartbeatLost"  # details: {"silent_for_s": float}
    # The provider will take the machine away soon: a spot/preemptible VM's preemption or a
    # host maintenance it cannot live-migrate through (GCE's metadata ``instance/preempted``,
    # ``maintenance-event``). ``since`` is when the notice came; the node is gone after it.
    PREEMPTION_NOTICE = "PreemptionNotice"  # details: {"notice_s": float, "kind": str}
    # The deep checks' collective test (all_reduce_perf with peers), not a periodic probe:
    # details: {"busbw_gbps", "min_busbw_gbps", "ratio_to_threshold", "wrong", "corrupt"}
    COLLECTIVE_BANDWIDTH_LOW = "CollectiveBandwidthLow"
    # A person's decisions, not a machine's: an administrator's own drain (TRUE with their
    # reason, FALSE once lifted; the Slurm adapter reports one it did not make, `mtc node
    # drain` sets it) and a resume they made of a node mtc holds out (the Slurm adapter).
    DRAINED_BY_OPERATOR = "DrainedByOperator"  # details: {"slurm_node", "slurm_reason"} | {"by"}
    RESUMED_BY_OPERATOR = "ResumedByOperator"  # details: {"slurm_node", "mtc_reason"}
    # The cloud's own notice: the host under the node has maintenance scheduled (Compute
    # Engine's resourceStatus.upcomingMaintenance), reported by the compute adapter.
    UPCOMING_MAINTENANCE = "UpcomingMaintenance"  # details: {"type", "window_start", ...}
    # From a job's own per-rank progress (``shared.adapters.compute.rank_progress``), about
    # the node a rank runs on: the rank a hang waits for (``culprit`` null: the program's own)
    # and a rank persistently slower than its peers. Evidence, not a fault: the node stays
    # sound for the recovery policy unless its own checks say otherwise.
    HANG_IN_JOB = "HangInJob"  # details: {"job_id", "attempt", "culprit", "silent_s", ...}
    SLOW_IN_JOB = "SlowInJob"  # details: {"job_id", "attempt", "rank", "ratio_to_peers"}
    # The active checks' known-answer compute test on an idle node (shared.probes.known_answer):
    # details: {"checksum", "expected", "corrupt": bool, "slow": bool, "ratio_to_baseline"}
    KNOWN_ANSWER_MISMATCH = "KnownAnswerMismatch"


# conditions that slow or warn but do not end a job's attempt (a node with only these is sound)
NON_FATAL_CONDITIONS = frozenset({ConditionType.SLOW_SPEED_CHECK.value,
                                  ConditionType.THERMAL_THROTTLING.value,
                                  ConditionType.DISK_PRESSURE.value,
                                  ConditionType.HANG_IN_JOB.value,
                                  ConditionType.SLOW_IN_JOB.value})

# condition types only an operator sets and lifts: an agent's report cannot clear them
OPERATOR_CONDITIONS = frozenset({ConditionType.DRAINED_BY_OPERATOR.value,
                                 ConditionType.RESUMED_BY_OPERATOR.value})
OPERATOR_SOURCE = "operator"
# reports made about a node from outside it (the heartbeat monitor, the cloud's compute API):
# they say nothing about its agent being alive, so they are no heartbeat
COMPUTE_SOURCE = "compute-engine"
JOB_PROGRESS_SOURCE = "job-progress"  # the adapters' reading of the ranks' heartbeats
PREFLIGHT_SOURCE = "preflight"  # a gang's preflight (service_layer.preflight) blames a node
ACTIVE_CHECK_SOURCE = "active-check"  # an idle node's active checks (service_layer.active_checks)
REMOTE_SOURCES = frozenset({"heartbeat-monitor", COMPUTE_SOURCE, JOB_PROGRESS_SOURCE,
                            PREFLIGHT_SOURCE, ACTIVE_CHECK_SOURCE})


class Severity(enum.StrEnum):
    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class RepairAction(enum.StrEnum):
    """What to do about a diagnosis, ordered from cheapest to most disruptive."""

    NONE = "none"
    RESTART_JOB = "restart_job"  # the application must restart; the node stays in service
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REIMAGE = "reimage"
    REPLACE = "replace"
    MANUAL = "manual"  # a person must look; the node is drained and held

    @property
    def takes_node_out(self) -> bool:
        return self not in (RepairAction.NONE, RepairAction.RESTART_JOB)


class _NoDetails(Mapping[str, Any]):
    """The details of a condition that has none: one shared, immutable, empty mapping (a
    report carries a dozen such conditions), which pickles and copies as itself (a
    ``MappingProxyType`` does neither)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __reduce__(self) -> tuple[Callable[[], _NoDetails], tuple[()]]:
        return _no_details, ()

    def __repr__(self) -> str:
        return "{}"


def _no_details() -> _NoDetails:
    return _NO_DETAILS


_NO_DETAILS = _NoDetails()


class Condition(NamedTuple):
    """One check's state in a report (node-problem-detector's condition). Immutable, and a
    NamedTuple rather than a frozen dataclass: a report carries a dozen and an agent reports
    every few minutes, so building one is most of what parsing a report costs."""

    type: str
    status: ConditionStatus
    reason: str
    since: float  # epoch seconds when the status last changed (or was first seen)
    details: Mapping[str, Any] = _NO_DETAILS

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status.value,
            "reason": self.reason,
            "since": self.since,
            "details": dict(self.details),
        }

    @classmethod
    def parse_all(cls, raw: Iterable[Mapping[str, Any]]) -> tuple[Condition, ...]:
        """A report's conditions, each by :meth:`from_dict` (whose fast path builds a
        well-formed one after a few type checks, and whose validators name a bad field)."""
        parse = cls.from_dict
        return tuple([parse(c) for c in raw])  # (a list: no generator frame)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Condition:
        # a well-formed condition (every agent report, thousands a run) is built after a few
        # type checks; anything else takes the validators below, which name the bad field
        if type(data) is dict:
            ctype, since, details = data.get("type"), data.get("since"), data.get("details")
            parsed = _STATUSES.get(data.get("status"))  # type: ignore[arg-type]
            if parsed is not None and type(ctype) is str and ctype and type(since) is float \
                    and math.isfinite(since) and (details is None or type(details) is dict):
                return cls(ctype, parsed, str(data.get("reason", "")), since,
                           dict(details) if details else _NO_DETAILS)
        status = require_str(data, "status")
        try:
            parsed_status = ConditionStatus(status.lower())
        except ValueError as exc:
            raise ValidationError("status", f"must be true, false or unknown, got {status!r}") from exc
        details = data.get("details") or {}
        if not isinstance(details, Mapping):
            raise ValidationError("details", "must be an object")
        return cls(
            type=require_str(data, "type"),
            status=parsed_status,
            reason=str(data.get("reason", "")),
            since=require_number(data, "since"),
            details=dict(details) if details else _NO_DETAILS,
        )


@dataclass(frozen=True)
class HealthReport:
    node_id: str
    observed_at: float
    conditions: tuple[Condition, ...]
    source: str = "agent"  # agent | post-repair-check | heartbeat-monitor | operator

    def condition(self, ctype: str) -> Condition | None:
        for c in self.conditions:  # (a loop, not next() over a generator: every report asks)
            if c.type == ctype:
                return c
        return None


@dataclass(frozen=True)
class FailureRecord:
    """One diagnosed failure in a node's history; the repair ladder climbs on these."""

    at: float
    failure_mode: str
    action: RepairAction


@dataclass(frozen=True)
class Diagnosis:
    failure_mode: str  # "healthy" when nothing is wrong
    severity: Severity
    action: RepairAction
    reasons: tuple[str, ...] = ()
    unmapped_xids: tuple[int, ...] = ()
    unknown_checks: tuple[str, ...] = ()  # condition types that could not be checked

    @property
    def healthy(self) -> bool:
        return self.action is RepairAction.NONE and self.severity in (Severity.OK, Severity.INFO)
