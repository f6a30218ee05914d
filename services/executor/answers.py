"""What the control plane must hear when the executor refuses a request it waits on.

A request refused past its deadline is never applied (the module docstring of
``executor``). For most calls that is all: a cordon, an uncordon or a signal asked for
minutes ago describes a wish the control plane states again. Three calls, though, are
waited on for a result that would now never come, and without one the job or node would
wait for ever:

* ``start_workers``: the attempt never ran. It ends at once with exit 75 (run me again),
  so checkpoint_resume requeues the job as after any interruption, instead of a RUNNING
  job with no workers;
* ``start_repair``: the repair did not happen; it is reported failed, so the repair
  ladder plans again;
* ``start_deep_check``: the checks did not run; both come back ``unknown``, never a pass,
  and the deep-check policy decides.

The answer is sent before the refusal is recorded, so a crash between the two repeats the
answer on redelivery, which the handlers ignore (the attempt or repair has moved on); the
other order could lose it.
"""

from __future__ import annotations

from typing import Any

from shared.adapters.compute.remote.codec import ComputeRequest, gang_of_args
from shared.domain.errors import ValidationError
from shared.domain.events import Event, JobWorkersExited, NodeHealthReported, NodeRepairCompleted
from shared.domain.exits import PREEMPTED
from shared.domain.health import ConditionStatus, ConditionType
from shared.policies.repair import DEEP_CHECK_SOURCE
from shared.service_layer.deep_checks import ATTEMPT

CAUSE = "compute_request_refused"  # the interruption cause the goodput tally shows


def refusal_answer(request: ComputeRequest, reason: str, now: float) -> Event | None:
    """The event that stands for the result of ``request``, which was refused for
    ``reason``; None for a call nothing waits on (or whose arguments cannot be read)."""
    args = request.args
    try:
        if request.op == "start_workers":
            gang = gang_of_args(args)
            return JobWorkersExited(job_id=gang.job_id, attempt=gang.attempt,
                                    exit_code=PREEMPTED,
                                    detail=f"cause={CAUSE} not started: {reason}")
        if request.op == "start_repair":
            return NodeRepairCompleted(node_id=str(args["node_id"]), action=str(args["action"]),
                                       attempt=int(args["attempt"]), ok=False,
                                       detail=f"not started: {reason}")
        if request.op == "start_deep_check":
            return _unknown_deep_check(str(args["node_id"]), int(args["attempt"]), reason, now)
    except (KeyError, TypeError, ValueError, ValidationError):
        return None
    return None


def _unknown_deep_check(node_id: str, attempt: int, reason: str, now: float
                        ) -> NodeHealthReported:
    conditions: tuple[dict[str, Any], ...] = tuple(
        {"type": ctype.value, "status": ConditionStatus.UNKNOWN.value,
         "reason": f"not run: {reason}", "since": now, "details": {ATTEMPT: attempt}}
        for ctype in (ConditionType.DCGM_DIAG_FAILED, ConditionType.COLLECTIVE_BANDWIDTH_LOW))
    return NodeHealthReported(node_id=node_id, observed_at=now, conditions=conditions,
                              source=DEEP_CHECK_SOURCE)
