"""Team queues in the twin (fair share, ``shared.policies.fair_share``): the scenario's
``cluster.queues`` and each job's ``team``, handed to the control plane as the API carries
them (the cluster's ``queues``, the job's ``mtc-team`` label), and the per-team figures a
run and a sweep report: goodput, hours waiting for capacity, and hours lost to preemption.

A scenario's queue: ``{team, partition, nominal, borrowing_limit}`` (nodes; no
``borrowing_limit``: no limit). A sweep varies a quota by its path, e.g.
``--vary cluster.queues.0.nominal=8,16`` (``docs/simulator.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.domain import queues as domain_queues
from shared.domain.errors import ValidationError
from shared.goodput.totals import Badput, JobGoodput
from simulator.readers import ScenarioError, get, integer, join, mapping, only_keys, text
from simulator.scenario_types import JobCfg, QueueCfg

__all__ = ["cluster_queues", "job_labels", "parse_queues", "team_figures"]


def parse_queues(value: Any, path: str, partitions: Mapping[str, int]) -> tuple[QueueCfg, ...]:
    """``partitions``: worker nodes per partition (spares left out)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ScenarioError(path, "must be a list")
    out = []
    for i, item in enumerate(value):
        qpath = join(path, i)
        data = mapping(item, qpath)
        only_keys(data, qpath, ("team", "partition", "nominal", "borrowing_limit"))
        limit = data.get("borrowing_limit")
        out.append(QueueCfg(
            team=text(data.get("team"), join(qpath, "team")),
            partition=text(get(data, "partition", next(iter(partitions))),
                           join(qpath, "partition")),
            nominal=integer(data.get("nominal"), join(qpath, "nominal"), low=0),
            borrowing_limit=None if limit is None
            else integer(limit, join(qpath, "borrowing_limit"), low=0)))
    try:  # the control plane's own rules, named in the scenario's terms
        domain_queues.check([domain_queues.QueueSpec(q.team, q.partition, q.nominal,
                                                     q.borrowing_limit) for q in out],
                            path, partitions)
    except ValidationError as exc:
        where = exc.path.replace("nominalNodes", "nominal")
        raise ScenarioError(where, exc.reason) from exc
    return tuple(out)


def cluster_queues(queues: Sequence[QueueCfg]) -> list[dict[str, Any]]:
    return [{"team": q.team, "partition": q.partition, "nominalNodes": q.nominal,
             **({} if q.borrowing_limit is None else {"borrowingLimitNodes": q.borrowing_limit})}
            for q in queues]


def job_labels(job: JobCfg) -> dict[str, str]:
    return {domain_queues.TEAM_LABEL: job.team} if job.team else {}


def team_figures(jobs: Iterable[JobCfg], accounting: Mapping[str, JobGoodput]
                 ) -> dict[str, dict[str, float]]:
    """Per team (a job without one: ``default``): goodput weighted by the jobs' time, the
    hours its jobs waited for capacity and the hours lost to preemption."""
    out: dict[str, dict[str, float]] = {}
    for job in jobs:
        jg = accounting.get(job.name)
        if jg is None:
            continue
        team = job.team or domain_queues.DEFAULT_TEAM
        fig = out.setdefault(team, {"time_s": 0.0, "good_s": 0.0, "waiting_h": 0.0,
                                    "preemption_h": 0.0})
        fig["time_s"] += jg.total_s
        fig["good_s"] += jg.goodput * jg.total_s
        fig["waiting_h"] += jg.lost(Badput.WAITING_FOR_CAPACITY) / 3600.0
        fig["preemption_h"] += jg.by_cause().get("preemption", 0.0) / 3600.0
    return {team: {"goodput": f["good_s"] / f["time_s"] if f["time_s"] else 0.0,
                   "waiting_h": f["waiting_h"], "preemption_h": f["preemption_h"]}
            for team, f in sorted(out.items())}
