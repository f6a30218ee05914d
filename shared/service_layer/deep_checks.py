"""The deep-check gate's moves on a node, shared by the handlers that open and close it.

- ``request``: a node about to enter service (provisioning: first join or a replacement;
  repair: a reimage, or any repair of a node that failed its deep checks) gets a pending
  ``DeepCheck`` verdict and compute is asked to run the checks (``shared.ports.DeepChecks``:
  DCGM level 2/3 and all_reduce_perf in a Slurm maintenance reservation). A compute backend
  that does not offer that port gives an ``unknown`` verdict at once, never a pass.
- ``record``: the checks' results (a HealthReport from source ``deep-check``) become the
  verdict (policy: ``shared.policies.repair.deep_check_verdict``). Health triage diagnoses
  the failed checks like any report, so the repair ladder acts on them; the verdict itself
  gates the return to service (``gate_allows_return``).

The key of a node's deep check is its repair attempt + 1: one check per life of the node.
"""

from __future__ import annotations

import logging

from shared.domain.health import ConditionStatus, HealthReport
from shared.domain.model import Node, NodeCondition
from shared.handling import Deps
from shared.policies.repair import (
    DEEP_CHECK,
    PENDING,
    DeepCheckVerdict,
    deep_check_verdict,
    deep_check_wanted,
    gate_allows_return,
)
from shared.ports import DeepChecks

log = logging.getLogger(__name__)
ATTEMPT = "deep_check_attempt"  # the details key a deep check's conditions carry


def attempt_of(node: Node) -> int:
    return node.repair_attempt + 1


def request(node: Node, trigger: str, deps: Deps) -> bool:
    """Open the gate for ``node`` if policy wants deep checks now; True when it did."""
    gate = node.conditions.get(DEEP_CHECK)
    if not deep_check_wanted(trigger, gate.status if gate else None, deps.config.repair):
        return False
    now = deps.clock.now()
    attempt = attempt_of(node)
    node.conditions[DEEP_CHECK] = NodeCondition(
        ConditionStatus.UNKNOWN.value, f"{PENDING}: deep checks before service ({trigger}, "
        f"attempt {attempt})", now, now)
    if not isinstance(deps.compute, DeepChecks):
        _set(node, DeepCheckVerdict(ConditionStatus.UNKNOWN, "deep checks could not run: this "
                                    "compute backend runs none"), now)
        return True
    deps.compute.start_deep_check(node.node_id, attempt)
    return True


def record(node: Node, report: HealthReport, now: float) -> bool:
    """The results of this life's deep check become its verdict; True when it changed.
    Results of an earlier attempt (a late delivery) change nothing."""
    attempts = {c.details.get(ATTEMPT) for c in report.conditions}
    if attempts != {attempt_of(node)}:
        log.info("%s: deep-check results for attempt %s ignored (now %s)", node.node_id,
                 sorted(map(str, attempts)), attempt_of(node))
        return False
    gate = node.conditions.get(DEEP_CHECK)
    if gate is None or not gate.reason.startswith(PENDING):
        return False  # already judged (a redelivery)
    levels = [c.details.get("level") for c in report.conditions if c.details.get("level")]
    _set(node, deep_check_verdict(report.conditions, levels[0] if levels else None), now)
    return True


def _set(node: Node, verdict: DeepCheckVerdict, now: float) -> None:
    node.conditions[DEEP_CHECK] = NodeCondition(verdict.status.value, verdict.reason, now, now)
    log.info("%s: %s", node.node_id, verdict.reason)


def allows_return(node: Node, deps: Deps) -> bool:
    gate = node.conditions.get(DEEP_CHECK)
    return gate_allows_return(gate.status if gate else None, gate.reason if gate else "",
                              deps.config.repair)
