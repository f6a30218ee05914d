"""Repair policy: from a diagnosis and the node's history to one repair decision. Pure.

Three rules, in this order:
1. Lemon: a node with ``lemon_failure_count`` node-level failures (this one included) within
   ``lemon_window_s`` goes straight to REPLACE; fixing it again only buys the next failure.
2. Ladder: a node that fails again within ``escalation_window_s`` of its previous node-level
   failure climbs one rung above that failure's action (never below what triage asked for).
3. Blast-radius guard: never take more nodes of a partition out of service than allowed, and
   never remove more than allowed within ``blast_window_s``; past either limit the decision is
   HOLD (the node stays in, an alert is raised), because mass removal is far more often a
   misclassification or a shared cause (switch, bad driver push) than many broken nodes.
   Both limits are fractions of the partition with a floor of one node: 25% out at once and
   75% removed per hour by default, so a 4-node partition repairs one node at a time and heals
   three faults within an hour (only the whole partition cycling through repair in an hour,
   what a shared cause looks like, is held). The removal limit used to equal the
   out-of-service one, which on a small partition meant one removal per hour: README's 4-node
   cluster held its 2nd and 3rd fault.

4. Deep-check gate (``deep_check_*`` below): before a node first joins, and before a reimaged or
   replaced one returns, it must pass DCGM level 2/3 and a collective bandwidth test; the
   verdict is a condition (``DeepCheck``) and ``gate_allows_return`` decides, by a table, what a
   passed, failed, unknown or pending verdict means for the return to service.

A failure mode the provider enforces (``PROVIDER_FORCED_MODES``: a spot VM's preemption
notice) skips the guard: the node leaves whether mtc acts or not, so holding it saves no
capacity and only costs the job its checkpoint before the VM goes.

"Node-level failure" means a FailureRecord whose action takes the node out of service; records
with action NONE (e.g. unconfirmed sightings triage asked to keep) or RESTART_JOB (application
faults) neither climb the ladder nor make a lemon. ``history`` holds the node's earlier
failures, not the one being decided; records later than ``now`` are ignored.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from shared.domain.errors import ValidationError
from shared.domain.health import (
    Condition,
    ConditionStatus,
    ConditionType,
    Diagnosis,
    FailureRecord,
    RepairAction,
)
from shared.policies.ranking import action_rank

DEFAULT_LADDER: tuple[RepairAction, ...] = (
    RepairAction.RESET_GPU,
    RepairAction.REBOOT,
    RepairAction.REIMAGE,
    RepairAction.REPLACE,
)


@dataclass(frozen=True)
class RepairConfig:
    """Repair knobs; validated on construction (ValidationError names the field)."""

    ladder: tuple[RepairAction, ...] = DEFAULT_LADDER
    escalation_window_s: float = 24 * 3600.0
    lemon_failure_count: int = 3
    lemon_window_s: float = 7 * 24 * 3600.0
    max_out_of_service_fraction: float = 0.25
    min_out_of_service_allowed: int = 1
    blast_window_s: float = 3600.0
    # Removals allowed per blast window: a count, or None for max(min_out_of_service_allowed,
    # floor(max_removals_fraction_in_window * partition size)).
    max_removals_in_window: int | None = None
    max_removals_fraction_in_window: float = 0.75
    return_after_passes: int = 2
    return_min_interval_s: float = 0.0
    # Deep checks (DCGM level 2/3 and all_reduce_perf, in a Slurm maintenance reservation)
    # before a node enters service on these occasions (DEEP_CHECK_TRIGGERS); none by default
    # because they take minutes to hours of a node's time.
    deep_checks_on: frozenset[str] = frozenset()
    # What a check that could not run (tools absent, no threshold) means: "pass" returns the
    # node with the "unknown" verdict recorded on it, "hold" keeps it out until a person looks.
    deep_check_on_unknown: str = "pass"
    # Racks as a unit of failure (shared.policies.domains): the share of a rack's nodes bad
    # at which the rack is drained and repaired as one (0: off, repairs stay per node), and
    # how many racks of a partition may be drained as one at a time.
    domain_drain_fraction: float = 0.0
    max_domains_out: int = 1

    def __post_init__(self) -> None:
        if not self.ladder:
            raise ValidationError("ladder", "must name at least one action")
        for index, action in enumerate(self.ladder):
            if not isinstance(action, RepairAction):
                raise ValidationError(f"ladder[{index}]", f"not a RepairAction: {action!r}")
            if not action.takes_node_out or action is RepairAction.MANUAL:
                raise ValidationError(
                    f"ladder[{index}]", f"{action} is not a node repair (MANUAL is off-ladder)"
                )
            if index and action_rank(action) <= action_rank(self.ladder[index - 1]):
                raise ValidationError(
                    f"ladder[{index}]", "rungs must be distinct and in increasing disruption"
                )
        for name in ("escalation_window_s", "lemon_window_s", "blast_window_s"):
            if getattr(self, name) < 0:
                raise ValidationError(name, "must not be negative")
        if self.return_min_interval_s < 0:
            raise ValidationError("return_min_interval_s", "must not be negative")
        if self.lemon_failure_count < 1:
            raise ValidationError("lemon_failure_count", "must be at least 1")
        for name in ("max_out_of_service_fraction", "max_removals_fraction_in_window"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValidationError(name, "must be between 0 and 1")
        if self.min_out_of_service_allowed < 0:
            raise ValidationError("min_out_of_service_allowed", "must not be negative")
        if self.max_removals_in_window is not None and self.max_removals_in_window < 0:
            raise ValidationError("max_removals_in_window", "must not be negative")
        if not 0.0 <= self.domain_drain_fraction <= 1.0:
            raise ValidationError("domain_drain_fraction", "must be between 0 and 1")
        if self.max_domains_out < 0:
            raise ValidationError("max_domains_out", "must not be negative")
        if self.return_after_passes < 1:
            raise ValidationError("return_after_passes", "must be at least 1")
        object.__setattr__(self, "deep_checks_on", frozenset(self.deep_checks_on))
        unknown = sorted(set(self.deep_checks_on) - set(DEEP_CHECK_TRIGGERS))
        if unknown:
            raise ValidationError("deep_checks_on", f"unknown trigger {unknown[0]!r} (expected "
                                  f"some of {list(DEEP_CHECK_TRIGGERS)})")
        if self.deep_check_on_unknown not in UNKNOWN_POLICIES:
            raise ValidationError("deep_check_on_unknown", f"must be one of {list(UNKNOWN_POLICIES)}")


DEEP_CHECK_TRIGGERS = ("first_join", "reimage", "replace")
UNKNOWN_POLICIES = ("pass", "hold")


def load_repair_config(mapping: Mapping[str, Any]) -> RepairConfig:
    """Build a RepairConfig from plain data (JSON/YAML); absent keys keep their defaults."""
    if not isinstance(mapping, Mapping):
        raise ValidationError("", "must be an object")
    known = {f.name for f in fields(RepairConfig)}
    kwargs: dict[str, Any] = {}
    for key, value in mapping.items():
        if key not in known:
            raise ValidationError(str(key), f"unknown key (expected one of {sorted(known)})")
        if key == "ladder":
            kwargs[key] = _parse_ladder(value)
        elif key == "deep_checks_on":
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise ValidationError(key, "must be a list of triggers")
            kwargs[key] = frozenset(value)
        elif key == "deep_check_on_unknown":
            if not isinstance(value, str):
                raise ValidationError(key, f"must be a string, got {value!r}")
            kwargs[key] = value
        elif key in ("lemon_failure_count", "min_out_of_service_allowed", "return_after_passes",
                     "max_domains_out"):
            kwargs[key] = _int(value, key)
        elif key == "max_removals_in_window":
            kwargs[key] = None if value is None else _int(value, key)
        else:
            kwargs[key] = _float(value, key)
    return RepairConfig(**kwargs)


def _parse_ladder(value: Any) -> tuple[RepairAction, ...]:
    if not isinstance(value, list | tuple):
        raise ValidationError("ladder", "must be a list of actions")
    ladder = []
    for index, item in enumerate(value):
        try:
            ladder.append(RepairAction(str(item).lower()))
        except ValueError as exc:
            raise ValidationError(f"ladder[{index}]", f"unknown action {item!r}") from exc
    return tuple(ladder)


def _int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(key, f"must be an integer, got {value!r}")
    return value


def _float(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(key, f"must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PartitionView:
    """What the guard needs to know about the node's partition right now."""

    partition: str
    total_nodes: int
    out_of_service_node_ids: frozenset[str]
    removed_at: tuple[float, ...]  # when nodes of this partition were taken out (any order)
    settling: int = 0  # nodes still coming up: not in service yet, counted rather than listed

    def __post_init__(self) -> None:
        if self.total_nodes < 0:
            raise ValidationError("total_nodes", "must not be negative")
        if self.settling < 0:
            raise ValidationError("settling", "must not be negative")


class DecisionKind(enum.StrEnum):
    REPAIR = "repair"  # take the node out and run ``action``
    HOLD = "hold"  # blast-radius guard: keep the node in service (suspect), raise an alert
    RESTART_JOB = "restart_job"  # no node action; restart the job running on it
    NO_ACTION = "no_action"


@dataclass(frozen=True)
class RepairDecision:
    kind: DecisionKind
    action: RepairAction  # for HOLD: the action that was held back
    reason: str
    is_lemon: bool = False
    rung: int = -1  # index of ``action`` in the ladder, -1 when off the ladder


# the triage table's failure modes for a machine the provider takes away after a notice
PROVIDER_FORCED_MODES = frozenset({"preemption_notice"})


def plan_repair(
    diagnosis: Diagnosis,
    history: Sequence[FailureRecord],
    partition: PartitionView,
    node_id: str,
    now: float,
    config: RepairConfig,
) -> RepairDecision:
    """Decide what to do about ``diagnosis`` on ``node_id``."""
    wanted = diagnosis.action
    if wanted is RepairAction.NONE:
        return RepairDecision(DecisionKind.NO_ACTION, wanted, f"{diagnosis.failure_mode}: none")
    if wanted is RepairAction.RESTART_JOB:
        return RepairDecision(
            DecisionKind.RESTART_JOB, wanted, f"{diagnosis.failure_mode}: restart the job only"
        )

    if diagnosis.failure_mode in PROVIDER_FORCED_MODES:
        rung = config.ladder.index(wanted) if wanted in config.ladder else -1
        return RepairDecision(DecisionKind.REPAIR, wanted, f"{diagnosis.failure_mode}: {wanted}"
                              " (the provider takes the node: not held)", False, rung)

    past = [r for r in history if r.at <= now and r.action.takes_node_out]
    in_lemon_window = [r for r in past if r.at >= now - config.lemon_window_s]
    failures = len(in_lemon_window) + 1
    if failures >= config.lemon_failure_count:
        action = RepairAction.REPLACE
        reason = (
            f"{diagnosis.failure_mode}: lemon, {failures} failures within "
            f"{config.lemon_window_s:g}s (limit {config.lemon_failure_count}): replace"
        )
        return _guard(action, reason, True, partition, node_id, now, config)

    if wanted is RepairAction.MANUAL:
        reason = f"{diagnosis.failure_mode}: drain and hold for a person"
        return _guard(wanted, reason, False, partition, node_id, now, config)

    action, reason = _climb(wanted, past, now, config)
    return _guard(
        action, f"{diagnosis.failure_mode}: {reason}", False, partition, node_id, now, config
    )


def _climb(
    wanted: RepairAction, past: Sequence[FailureRecord], now: float, config: RepairConfig
) -> tuple[RepairAction, str]:
    own = _rung_at_or_above(wanted, config.ladder)
    if own < 0:
        return wanted, f"{wanted} (above the ladder)"
    recent = [r for r in past if r.at >= now - config.escalation_window_s]
    if not recent:
        return config.ladder[own], f"{config.ladder[own]} (first failure in window)"
    previous = max(recent, key=lambda r: r.at)
    prev_rung = _rung_at_or_above(previous.action, config.ladder)
    above_prev = len(config.ladder) - 1 if prev_rung < 0 else prev_rung + 1
    rung = min(max(own, above_prev), len(config.ladder) - 1)
    return config.ladder[rung], (
        f"{config.ladder[rung]} (failed again {now - previous.at:g}s after {previous.action}; "
        f"triage asked for {wanted})"
    )


def _rung_at_or_above(action: RepairAction, ladder: Sequence[RepairAction]) -> int:
    """Index of the cheapest rung at least as disruptive as ``action``; -1 when none is."""
    return next(
        (i for i, rung in enumerate(ladder) if action_rank(rung) >= action_rank(action)), -1
    )


def allowed_out_of_service(total_nodes: int, config: RepairConfig) -> int:
    """How many nodes of a partition may be out of service at once."""
    share = math.floor(config.max_out_of_service_fraction * total_nodes + 1e-9)
    return max(config.min_out_of_service_allowed, share)


def allowed_removals_in_window(total_nodes: int, config: RepairConfig) -> int:
    """How many nodes of a partition may be taken out within ``blast_window_s``."""
    if config.max_removals_in_window is not None:
        return config.max_removals_in_window
    share = math.floor(config.max_removals_fraction_in_window * total_nodes + 1e-9)
    return max(config.min_out_of_service_allowed, share)


def _guard(
    action: RepairAction,
    reason: str,
    is_lemon: bool,
    partition: PartitionView,
    node_id: str,
    now: float,
    config: RepairConfig,
) -> RepairDecision:
    """Apply the blast-radius guard to a decision that takes the node out.

    A node already out of service costs nothing more. Otherwise two limits, each
    max(min_out_of_service_allowed, floor(fraction * total_nodes)) with its own fraction
    (``max_removals_in_window`` overrides the second with a count):
    - out of service now: |out_of_service_node_ids| + settling + 1 must not exceed ``allowed``;
    - removals: |removed_at within [now - blast_window_s, now]| + 1 must not exceed the limit.
    """
    rung = config.ladder.index(action) if action in config.ladder else -1
    if node_id in partition.out_of_service_node_ids:
        return RepairDecision(
            DecisionKind.REPAIR, action, f"{reason}; node already out of service", is_lemon, rung
        )
    allowed = allowed_out_of_service(partition.total_nodes, config)
    out_now = len(partition.out_of_service_node_ids) + partition.settling
    if out_now + 1 > allowed:
        return RepairDecision(
            DecisionKind.HOLD,
            action,
            f"{reason}; HOLD: {out_now} of {partition.total_nodes} nodes in "
            f"{partition.partition} already out of service (limit {allowed})",
            is_lemon,
            rung,
        )
    removal_limit = allowed_removals_in_window(partition.total_nodes, config)
    recent = sum(1 for t in partition.removed_at if now - config.blast_window_s <= t <= now)
    if recent + 1 > removal_limit:
        return RepairDecision(
            DecisionKind.HOLD,
            action,
            f"{reason}; HOLD: {recent} nodes of {partition.partition} removed in the last "
            f"{config.blast_window_s:g}s (limit {removal_limit})",
            is_lemon,
            rung,
        )
    return RepairDecision(DecisionKind.REPAIR, action, reason, is_lemon, rung)


def next_rung_after_failure(current: RepairAction, config: RepairConfig) -> RepairAction:
    """The action to try when ``current`` itself failed: the next rung up; past the top, MANUAL."""
    if current is RepairAction.MANUAL:
        return RepairAction.MANUAL
    return next(
        (rung for rung in config.ladder if action_rank(rung) > action_rank(current)),
        RepairAction.MANUAL,
    )


def ready_to_return(
    passes: int, first_pass_at: float | None, now: float, config: RepairConfig
) -> bool:
    """Hysteresis: back in service only after ``return_after_passes`` consecutive healthy
    reports spanning at least ``return_min_interval_s`` (measured from the first pass)."""
    if passes < 0:
        raise ValueError(f"passes must not be negative, got {passes}")
    if passes < config.return_after_passes:
        return False
    if config.return_min_interval_s <= 0:
        return True
    return first_pass_at is not None and now - first_pass_at >= config.return_min_interval_s


# ---------------------------------------------------------------- the deep-check gate

DEEP_CHECK = "DeepCheck"  # the verdict's condition type on the node (set by mtc, not an agent)
DEEP_CHECK_SOURCE = "deep-check"  # the HealthReport source of a deep check's results
_TRUE = ConditionStatus.TRUE.value
DEEP_CHECK_TYPES = (ConditionType.DCGM_DIAG_FAILED.value,
                    ConditionType.COLLECTIVE_BANDWIDTH_LOW.value)
PENDING = "pending"  # reason prefix of a verdict not in yet


@dataclass(frozen=True)
class DeepCheckVerdict:
    """The gate's condition: TRUE = failed, FALSE = passed, UNKNOWN = could not tell."""

    status: ConditionStatus
    reason: str
    failed: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


ROLLOUT_TRIGGER = "rollout"  # a reimage with a rollout's new (or rolled-back) version


def deep_check_wanted(trigger: str, gate_status: str | None, config: RepairConfig) -> bool:
    """Whether the node must pass deep checks before it (re)enters service: on a configured
    occasion, always after a software rollout's reimage (the gate is how a rollout sees a
    regression), and always after a repair of a node that failed them (it must pass them
    again, or the failed verdict would keep it out for ever)."""
    return trigger in config.deep_checks_on or trigger == ROLLOUT_TRIGGER \
        or gate_status == _TRUE


def deep_check_verdict(conditions: Sequence[Condition], level: int | None = None
                       ) -> DeepCheckVerdict:
    """Fold the deep check's results into one verdict. A check missing from the results is
    unknown; any failure fails the gate; unknown is never reported as passed."""
    by_type = {c.type: c for c in conditions if c.type in DEEP_CHECK_TYPES}
    failed = tuple(f"{t}: {by_type[t].reason}" for t in DEEP_CHECK_TYPES
                   if t in by_type and by_type[t].status is ConditionStatus.TRUE)
    unknown = tuple(f"{t}: {by_type[t].reason}" if t in by_type else f"{t}: not run"
                    for t in DEEP_CHECK_TYPES
                    if t not in by_type or by_type[t].status is ConditionStatus.UNKNOWN)
    what = f"deep checks (dcgm level {level})" if level else "deep checks"
    if failed:
        return DeepCheckVerdict(ConditionStatus.TRUE, f"{what} failed: " + "; ".join(failed),
                                failed, unknown)
    if unknown:
        return DeepCheckVerdict(ConditionStatus.UNKNOWN,
                                f"{what} could not tell: " + "; ".join(unknown), (), unknown)
    return DeepCheckVerdict(ConditionStatus.FALSE, f"{what} passed")


# verdict status -> (on_unknown policy -> may the node return?)
GATE_TABLE: Mapping[str, Mapping[str, bool]] = {
    ConditionStatus.FALSE.value: {"pass": True, "hold": True},
    ConditionStatus.TRUE.value: {"pass": False, "hold": False},
    ConditionStatus.UNKNOWN.value: {"pass": True, "hold": False},
}


def gate_allows_return(status: str | None, reason: str, config: RepairConfig) -> bool:
    """May a node whose deep-check verdict is (status, reason) return to service? No verdict
    at all: no deep check was asked of this node. Pending: not yet."""
    if status is None:
        return True
    if status == ConditionStatus.UNKNOWN.value and reason.startswith(PENDING):
        return False
    return GATE_TABLE.get(status, GATE_TABLE[ConditionStatus.UNKNOWN.value])[
        config.deep_check_on_unknown]
