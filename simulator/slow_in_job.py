"""Stragglers as a job sees them: a job that reports per-rank progress
(``rank_progress``) on a slowed node gets ``SlowInJob`` on that node, as the adapters'
``RankWatch`` would report it, and the real handlers act on it (triage, then repair weighs
moving the node by expected cost, ``shared.policies.stragglers``).

A node is slowed by a straggler of the failure model (``failures.stragglers``, speed ratio
``r``: ranks ``1/r`` x slower) or by a fault of a cause with ``slows: f`` (ranks ``f`` x
slower until a repair clears it; its node's own checks see nothing when its ``signal`` is
empty). The adapters' score is the median of a rank's compute time over its peers', so in the
twin it is exactly the slowdown; it is flagged when the policy says so
(``hangs.slow_in_job`` at ``1 + margin``) after the steps the policy needs (the attempt's
warm-up steps and ``min_steps`` scored, at the slowed step time) plus one read of the
heartbeats. The slow steps are program badput (``PROGRAM_SLOWDOWN``) until the node leaves.

:class:`SlowInJob` holds the fleet; launches and the stragglers ask it to watch an attempt.
"""

from __future__ import annotations

from shared.domain.events import NodeHealthReported
from shared.domain.health import JOB_PROGRESS_SOURCE, ConditionType
from shared.policies import hangs
from simulator.clock import EPOCH_S, call_later
from simulator.fleet import Fleet
from simulator.world import AGENT_SOURCE, Attempt

SLOW_CFG = hangs.SlowConfig()  # the adapters' defaults
READ_S = 2.0  # the adapters read the ranks' heartbeats this often (TIER_SCAN_S)


def detect_after_s(step_time_s: float, ratio: float) -> float:
    """From the slowed attempt's first step to the report: the steps scored, then a read."""
    steps = SLOW_CFG.warmup_steps + SLOW_CFG.min_steps
    return steps * step_time_s * ratio + READ_S


class SlowInJob:
    """The per-rank progress reading of the jobs that report it (see the module)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def watch(self, att: Attempt) -> None:
        """Schedule the report for each slowed node of ``att`` the policy would flag (once
        per attempt, node and slowdown)."""
        fleet = self.fleet
        if not att.job.cfg.rank_progress or not fleet.stragglers or att.exited \
                or not att.alive:
            return
        now = float(fleet.env.now)
        for node_id, speed in list(fleet.stragglers.items()):
            ratio = 1.0 / speed
            key = (att.job.job_id, att.number, node_id, speed)
            if key in fleet.slow_seen or node_id not in att.node_ids \
                    or not hangs.slow_in_job(False, ratio, SLOW_CFG):
                continue
            fleet.slow_seen.add(key)
            delay = max(0.0, att.ready - now) + detect_after_s(att.job.cfg.step_time_s, ratio)
            call_later(fleet.env, delay, self._report, att, node_id, speed)

    def _report(self, att: Attempt, node_id: str, speed: float) -> None:
        fleet = self.fleet
        node = fleet.nodes.get(node_id)
        if att.exited or not att.alive or att.stopped_at is not None \
                or att.job.attempt is not att or node is None or node.deleted \
                or fleet.stragglers.get(node_id) != speed:
            return  # moved, repaired or recovered before the score had enough steps
        ratio = 1.0 / speed
        fault = node.fault
        cause = fault.cause.name if fault is not None and fault.cause.slows > 1.0 \
            else "straggler"
        now = float(fleet.env.now)
        observed = EPOCH_S + now
        rank = att.node_ids.index(node_id)
        fleet.timeline.append((now, "slow found", node_id, att.job.job_id))
        fleet.emit(NodeHealthReported(node_id=node_id, observed_at=observed, conditions=({
            "type": ConditionType.SLOW_IN_JOB.value, "status": "true", "since": observed,
            "reason": f"job {att.job.job_id} rank {rank}: compute {ratio:.2f}x its peers' "
                      "median, slower than them",
            "details": {"job_id": att.job.job_id, "attempt": att.number, "rank": rank,
                        "ratio_to_peers": round(ratio, 4), "cause": cause}},),
            source=JOB_PROGRESS_SOURCE), AGENT_SOURCE)
