"""Preflight where GPUs exist: ``dcgmi diag -r N`` on each node of the gang and NCCL's
``all_reduce_perf`` across them (the whole gang, then each ring pair), through the probes
the deep checks use (``shared.probes.dcgm``, ``shared.probes.nccl``).

``launch(nodes)`` gives a ``Runner`` that runs an argv across exactly those nodes (on Slurm:
``srun --nodelist=...``, ``shared.adapters.compute.slurm.reservations.srun_runner``); this
module only decides what to run and turns the outputs into a ``PreflightResult`` that the
policy judges (``shared.policies.preflight.culprits``). A check that could not run (no
dcgmi, garbage output) is not a failure: the node's own check passes with its reason saying
``unknown``, and an all-reduce without a table is a collective that did not finish.

Not yet wired to a backend: the Slurm adapter would hold one, with an allocation of the
gang's nodes to run it in. Tested over recorded tool output.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from shared.domain.health import ConditionStatus
from shared.policies.preflight import NodeCheck, PairCheck, PreflightPlan, PreflightResult
from shared.probes import dcgm, nccl
from shared.probes.commands import ProbeError, Runner

Launch = Callable[[Sequence[str]], Runner]


class NcclPreflight:
    """The ``shared.ports.Preflight`` capability over dcgmi and all_reduce_perf."""

    def __init__(self, launch: Launch, *, all_reduce_perf: str = "all_reduce_perf",
                 dcgmi: str = "dcgmi", now: Callable[[], float] = time.time) -> None:
        self._launch = launch
        self._tool = all_reduce_perf
        self._dcgmi = dcgmi
        self._now = now

    def argv(self, plan: PreflightPlan) -> list[str]:
        """One message size (the plan's), ``iterations`` timed runs, values checked."""
        size = str(plan.message_bytes)
        return [self._tool, "-b", size, "-e", size, "-g", "1", "-n", str(plan.iterations),
                "-c", "1"]

    def run_preflight(self, job_id: str, node_ids: Sequence[str], plan: PreflightPlan
                      ) -> PreflightResult:
        started = self._now()
        checks = [self._node_check(n, plan) for n in node_ids]
        n = len(node_ids)
        groups = [tuple(node_ids)] + ([tuple(sorted({node_ids[i], node_ids[(i + 1) % n]},
                                                    key=list(node_ids).index))
                                       for i in range(n)] if n > 2 else [])
        collectives = [self._collective(g, plan) for g in groups]
        return PreflightResult(tuple(checks), tuple(collectives), started, self._now())

    def _node_check(self, node_id: str, plan: PreflightPlan) -> NodeCheck:
        try:
            cond = dcgm.probe(self._launch([node_id]), self._now(), tool=self._dcgmi,
                              level=plan.dcgm_level, timeout_s=plan.timeout_s)
        except ProbeError as exc:
            return NodeCheck(node_id, True, f"unknown: dcgmi could not run: {exc.reason}")
        return NodeCheck(node_id, cond.status is not ConditionStatus.TRUE, cond.reason)

    def _collective(self, nodes: tuple[str, ...], plan: PreflightPlan) -> PairCheck:
        try:
            cond = nccl.probe(self._launch(nodes), self._now(), self.argv(plan),
                              min_busbw_gbps=plan.min_busbw_gbps, timeout_s=plan.timeout_s,
                              nodes=nodes)
        except ProbeError:
            return PairCheck(nodes, None)
        busbw = cond.details.get("busbw_gbps")
        return PairCheck(nodes, float(busbw) if busbw is not None else None,
                         int(cond.details.get("wrong") or 0))
