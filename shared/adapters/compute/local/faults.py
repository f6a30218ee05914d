"""Simulated faults of LocalCompute's nodes: which repair truly fixes each one.

The "true fix" of a fault is the action the triage table prescribes for it
(``shared/policies/data/triage_table.v1.yaml``, from NVIDIA's XID catalog,
https://docs.nvidia.com/deploy/xid-errors/, and DCGM's diagnostic levels,
https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html), taken as
confirmed: a fault that stays is what repeated sightings would confirm. There is no second
table here, so changing the triage table changes what a local repair clears. On top of it:

* a "manual" outcome (the catalog's "a person must act") needs new hardware: REPLACE;
* "restart the job" or "none" leaves the node with nothing to repair: the fault is reported
  once and not kept;
* an ``unknown`` condition (the check could not run) needs REBOOT: a restart brings the
  agent back; an XID fault without codes is taken as the common reset class (RESET_GPU);
* ``details["clears_with"]`` (a RepairAction value) overrides all of it, for demos and tests.

The ladder is RESET_GPU < REBOOT < REIMAGE < REPLACE; an action clears every fault at or below
its rung. MANUAL never completes: a person must act. A repair that cannot fix a fault still
completes, and its post-repair check still shows the fault, which is what makes the control
plane climb the ladder.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from shared.domain.health import (
    Condition,
    ConditionStatus,
    ConditionType,
    FailureRecord,
    HealthReport,
    RepairAction,
)
from shared.policies.triage import HEALTHY, TriageTable, load_triage_table, triage

RA = RepairAction
CT = ConditionType

# How far up the ladder an action reaches; MANUAL is absent: it never completes.
RUNG: Mapping[RepairAction, int] = {
    RA.NONE: 0,
    RA.RESTART_JOB: 0,
    RA.RESET_GPU: 1,
    RA.REBOOT: 2,
    RA.REIMAGE: 3,
    RA.REPLACE: 4,
}
# The table's outcome -> what clears the fault on the node.
_ON_NODE: Mapping[RepairAction, RepairAction] = {RA.MANUAL: RA.REPLACE, RA.RESTART_JOB: RA.NONE}
_CONFIRMING_SIGHTINGS = 8  # more than any confirmation rule of the table asks for
_AT = 1_000_000.0  # triage is pure: any instant will do


@functools.cache
def _default_table() -> TriageTable:
    return load_triage_table()


def required_action(condition: Condition, table: TriageTable | None = None) -> RepairAction:
    """The cheapest repair that clears this fault; NONE: transient, nothing to keep."""
    override = condition.details.get("clears_with")
    if override is not None:
        try:
            return RepairAction(str(override))
        except ValueError:
            allowed = ", ".join(a.value for a in RepairAction)
            raise ValueError(
                f"details.clears_with must be one of {allowed}, got {override!r}"
            ) from None
    if condition.status is ConditionStatus.UNKNOWN:
        return RA.REBOOT
    if condition.type == CT.XID_ERROR and not condition.details.get("xids"):
        return RA.RESET_GPU
    action = _confirmed_action(condition, table or _default_table())
    return _ON_NODE.get(action, action)


def _confirmed_action(condition: Condition, table: TriageTable) -> RepairAction:
    """The triage table's action for this one condition, once its sightings confirm it."""
    true = Condition(condition.type, ConditionStatus.TRUE, condition.reason, condition.since,
                     condition.details)
    report = HealthReport("local-fault", _AT, (true,))
    history: list[FailureRecord] = []
    diagnosis = triage(report, history, _AT, table)
    for _ in range(2):  # the mode seen first may yield to a confirmed one: settle
        if diagnosis.failure_mode == HEALTHY:
            break
        history += [FailureRecord(_AT - 1.0 - i, diagnosis.failure_mode, RA.NONE)
                    for i in range(_CONFIRMING_SIGHTINGS)]
        diagnosis = triage(report, history, _AT, table)
    return diagnosis.action


def clears(action: RepairAction, needed: RepairAction) -> bool:
    """Whether ``action`` fixes a fault that needs ``needed`` (MANUAL fixes nothing itself)."""
    if action not in RUNG or needed not in RUNG:
        return False
    return RUNG[action] >= RUNG[needed]


def merge(prev: Condition, new: Condition) -> Condition:
    """Two faults of one type on a node: XIDs accumulate, anything else shows the newest."""
    if prev.type != CT.XID_ERROR:
        return new
    details = {**prev.details, **new.details}
    for key in ("xids", "gpus"):
        merged = list(prev.details.get(key) or [])
        merged += [v for v in new.details.get(key) or [] if v not in merged]
        if merged:
            details[key] = merged
    worst = (
        ConditionStatus.TRUE if ConditionStatus.TRUE in (prev.status, new.status) else new.status
    )
    reason = prev.reason if new.reason in ("", prev.reason) else f"{prev.reason}; {new.reason}"
    return Condition(prev.type, worst, reason, min(prev.since, new.since), details)
