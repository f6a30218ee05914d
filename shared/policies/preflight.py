"""Preflight: a bounded check among exactly a gang's nodes before they run it. Pure.

A node can pass its own checks and still fail every job it joins with the others (a NIC, a
cable, a switch port); NVSentinel's users asked for this (NVIDIA/NVSentinel#658). Before a
job's first start, and before a restart that places it on new nodes, the scheduler asks the
compute backend (``shared.ports.Preflight``) to run, on the job's nodes only:

- per node, the DCGM diagnostic at the level the cluster's mode sets (no GPU here: a
  known-answer compute test stands in for it, and says so in its reason);
- across them, an all-reduce timed against a bus-bandwidth floor, first over the whole gang,
  then over each ring pair (node i with node i+1) so that a slow link names its node: a node
  whose every pair is below the floor is the culprit, a node with one good pair is not.

The mode is per cluster, the label ``mtc-preflight``: ``off`` (the default), ``quick`` or
``thorough`` (a higher DCGM level, bigger messages, more iterations). What a mode runs is
this table, not code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.domain.errors import ValidationError

LABEL = "mtc-preflight"
FLOOR_LABEL = "mtc-preflight-min-busbw-gbps"  # the cluster's own floor (a GPU fabric's)
MODES = ("off", "quick", "thorough")


@dataclass(frozen=True)
class PreflightPlan:
    """What one preflight runs; ``min_busbw_gbps`` is the floor every pair must meet."""

    mode: str
    dcgm_level: int
    message_bytes: int
    iterations: int
    min_busbw_gbps: float
    timeout_s: float


# gloo on CPU moves about 0.5-3 GB/s between local processes; a GPU fabric's floor would be
# the node type's (all_reduce_perf's busbw), configured by the cluster's operator
PLANS: Mapping[str, PreflightPlan] = {
    "quick": PreflightPlan("quick", 1, 1 << 20, 5, 0.02, 60.0),
    "thorough": PreflightPlan("thorough", 2, 8 << 20, 20, 0.05, 300.0),
}


def mode_of(labels: Sequence[tuple[str, str]]) -> str:
    """The cluster's preflight mode from its labels; ValidationError naming the label."""
    mode = dict(labels).get(LABEL, "off")
    if mode not in MODES:
        raise ValidationError(f"labels.{LABEL}", f"must be one of {list(MODES)}, got {mode!r}")
    return mode


def floor_of(labels: Sequence[tuple[str, str]]) -> float | None:
    """The cluster's bus-bandwidth floor in GB/s, if it sets one; ValidationError naming
    the label when it is not a positive number."""
    text = dict(labels).get(FLOOR_LABEL)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValidationError(f"labels.{FLOOR_LABEL}", f"must be a positive number of GB/s, "
                              f"got {text!r}")
    return value


def plan_for(labels: Sequence[tuple[str, str]], min_busbw_gbps: float | None = None
             ) -> PreflightPlan | None:
    """The plan for a cluster (None: off). The floor: ``min_busbw_gbps``, else the cluster's
    label ``mtc-preflight-min-busbw-gbps``, else the mode's."""
    mode = mode_of(labels)
    floor = floor_of(labels)  # (validated whatever the mode)
    if mode == "off":
        return None
    plan = PLANS[mode]
    min_busbw_gbps = min_busbw_gbps if min_busbw_gbps is not None else floor
    if min_busbw_gbps is not None:
        plan = PreflightPlan(plan.mode, plan.dcgm_level, plan.message_bytes, plan.iterations,
                             min_busbw_gbps, plan.timeout_s)
    return plan


def wanted(attempt: int, placed: Sequence[str]) -> bool:
    """Before the first start, and before a restart that brings new nodes; a restart on the
    nodes the job already ran on (a preempted program) needs none."""
    return attempt == 0 or bool(placed)


@dataclass(frozen=True)
class NodeCheck:
    """One node's own check (the DCGM level, or its stand-in)."""

    node_id: str
    ok: bool
    reason: str


@dataclass(frozen=True)
class PairCheck:
    """One all-reduce among ``node_ids`` (the whole gang, or a ring pair)."""

    node_ids: tuple[str, ...]
    busbw_gbps: float | None  # None: it did not finish (a timeout, a crash)
    wrong: int = 0  # values that differ from the known sum: corruption


@dataclass(frozen=True)
class PreflightResult:
    node_checks: tuple[NodeCheck, ...]
    collectives: tuple[PairCheck, ...]  # the gang's first, then the ring pairs
    started_at: float
    finished_at: float
    ran: bool = True  # False: the backend could not run it (no tools): not a pass
    detail: str = ""


@dataclass(frozen=True)
class Culprit:
    node_id: str
    reason: str
    corrupt: bool
    busbw_gbps: float | None
    collective: bool = True  # False: its own check (the DCGM level, or its stand-in) failed


def _ok(check: PairCheck, floor: float) -> bool:
    return check.busbw_gbps is not None and check.busbw_gbps >= floor and check.wrong == 0


def culprits(result: PreflightResult, plan: PreflightPlan) -> tuple[Culprit, ...]:
    """The nodes to exclude: a failed own check, or every all-reduce the node was in failed
    while at least one that it was not in passed (else the gang as a whole is slow and no
    node can be blamed: with two nodes both are named, the check cannot tell them apart)."""
    floor = plan.min_busbw_gbps
    found: dict[str, Culprit] = {}
    for nc in result.node_checks:
        if not nc.ok:
            found[nc.node_id] = Culprit(nc.node_id, nc.reason, False, None, collective=False)
    pairs = [c for c in result.collectives if len(c.node_ids) == 2] \
        or list(result.collectives)
    gang_ok = all(_ok(c, floor) for c in result.collectives)
    if gang_ok:
        return tuple(found.values())
    nodes = sorted({n for c in pairs for n in c.node_ids})
    if len(nodes) > 2 and not any(_ok(c, floor) for c in pairs):
        return tuple(found.values())  # the fabric or the floor, not a node: inconclusive
    for node_id in nodes:
        mine = [c for c in pairs if node_id in c.node_ids]
        if not mine or any(_ok(c, floor) for c in mine):
            continue
        worst = min(mine, key=lambda c: c.busbw_gbps if c.busbw_gbps is not None else -1.0)
        corrupt = any(c.wrong for c in mine)
        bw = worst.busbw_gbps
        reason = ("all-reduce returned wrong values (corruption)" if corrupt else
                  f"all-reduce bus bandwidth {bw:.3g} GB/s below the floor {floor:g} GB/s"
                  if bw is not None else "all-reduce did not finish")
        found.setdefault(node_id, Culprit(node_id, f"preflight: {reason}", corrupt, bw))
    return tuple(found[n] for n in sorted(found))
