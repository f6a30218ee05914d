"""Goodput of one job of the live system: the shared accounting over its event log, with the
nominal figures the live system does not know read off the same log.

The twin knows each job's step time, save, restore and startup cost from its scenario; the
live system only has its events, so :func:`infer_params` measures them there:

- the step time is the job's pace between two consecutive checkpoints of one attempt, less the
  save (the steadiest stretch: the one with the most steps);
- the save cost is the median ``save_s`` of the job's ``JobCheckpointSaved`` events (0 when
  the Compute adapter did not measure it);
- each attempt's startup (and restore) is measured from its first checkpoint
  (``JobParams.measure_startup``), a slow first step included, as the public calculator does.

:func:`job_accounting` then runs :func:`shared.goodput.accounting.account`, the twin's code,
and summarises it in the figures the demo, the console and the metrics show.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.goodput.accounting import T_CKPT, T_FINISHED, T_STARTED, T_SUBMITTED, account
from shared.goodput.totals import Badput, JobGoodput, JobParams

__all__ = ["JobAccounting", "infer_params", "job_accounting", "pace", "save_costs", "step_time"]

# badput that is not the cost of a disruption: the first start, periodic saves, slowness
_ROUTINE_CAUSES = frozenset({"initial_start", "checkpointing", "slow_program"})


@dataclass(frozen=True)
class JobAccounting:
    """What a job lost and kept, in the few figures an operator reads first.

    ``wall_s`` runs from the job's first start to its end (or now); ``recovery_s`` is every
    second a disruption cost other than the lost progress (detection, drain, waiting for nodes
    again, restart, restore); ``lost_steps`` is the progress computed since the last
    checkpoint and lost, in steps at the measured pace. ``goodput`` is the full accounting."""

    wall_s: float
    recovery_s: float
    lost_steps: int
    restarts: int
    goodput: JobGoodput | None = None

    @property
    def productive_s(self) -> float:
        return self.goodput.productive_s if self.goodput is not None else 0.0

    @property
    def runtime_goodput(self) -> float:
        return self.goodput.runtime_goodput if self.goodput is not None else 0.0

    @property
    def lost_s(self) -> float:
        if self.goodput is None:
            return 0.0
        return self.goodput.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION)


def _ckpts(docs: Iterable[Mapping[str, Any]], job_id: str) -> list[tuple[int, float, int, float]]:
    """(attempt, saved_at, step, save_s) of the job's checkpoints, oldest first."""
    out = []
    for d in docs:
        data = d["data"]
        if d["type"] == T_CKPT and data.get("job_id") == job_id:
            out.append((int(data["attempt"]), float(data.get("saved_at", d["time"])),
                        int(data["step"]), float(data.get("save_s") or 0.0)))
    return sorted(out, key=lambda c: (c[1], c[2]))


def save_costs(docs: Iterable[Mapping[str, Any]], job_id: str) -> list[float]:
    """The measured durations of the job's checkpoint saves (those the adapter timed)."""
    return [c[3] for c in _ckpts(docs, job_id) if c[3] > 0]


def pace(docs: Iterable[Mapping[str, Any]], job_id: str, save_s: float = 0.0) -> float | None:
    """Seconds per step between two consecutive checkpoints of one attempt, the save taken
    out; the stretch with the most steps wins (None without two checkpoints in an attempt)."""
    best = (0.0, 0)
    ckpts = _ckpts(docs, job_id)
    for (a0, t0, s0, _), (a1, t1, s1, _) in itertools.pairwise(ckpts):
        if a0 == a1 and s1 > s0 and t1 - t0 > save_s and s1 - s0 > best[1]:
            best = (t1 - t0 - save_s, s1 - s0)
    return best[0] / best[1] if best[1] else None


def step_time(docs: Iterable[Mapping[str, Any]], job_id: str, save_s: float = 0.0) -> float:
    """:func:`pace`, or 1.0 s when the log cannot tell (then only the ETTR is right)."""
    measured = pace(docs, job_id, save_s)
    return 1.0 if measured is None else measured


def infer_params(docs: Sequence[Mapping[str, Any]], job_id: str, nodes: int = 1) -> JobParams:
    """The job's nominal figures, measured from its log (see the module docstring)."""
    saves = save_costs(docs, job_id)
    save = statistics.median(saves) if saves else 0.0
    pace = step_time(docs, job_id, save)
    overheads = _startups(docs, job_id, pace, save)
    return JobParams(step_time_s=pace, checkpoint_save_s=save, checkpoint_restore_s=0.0,
                     startup_s=statistics.median(overheads) if overheads else 0.0,
                     nodes=max(1, nodes), all_checkpoints=True, measure_startup=True)


def _startups(docs: Iterable[Mapping[str, Any]], job_id: str, pace: float,
              save: float) -> list[float]:
    """Each attempt's start to its first checkpoint, less the steps and the save: what an
    attempt that failed before its first checkpoint is assumed to have spent starting."""
    starts = {int(d["data"]["attempt"]): (float(d["time"]), int(d["data"].get("resume_step", -1)))
              for d in docs if d["type"] == T_STARTED and d["data"].get("job_id") == job_id}
    first: dict[int, tuple[float, int]] = {}
    for attempt, saved_at, step, _ in _ckpts(docs, job_id):
        first.setdefault(attempt, (saved_at, step))
    out = []
    for attempt, (saved_at, step) in first.items():
        if attempt in starts:
            started, resume = starts[attempt]
            overhead = saved_at - started - (step - max(resume, 0)) * pace - save
            if overhead >= 0:
                out.append(overhead)
    return out


def job_accounting(docs: Iterable[Mapping[str, Any]], job_id: str, *, now: float | None = None,
                   nodes: int = 1) -> JobAccounting:
    """The job's accounting from the event log, up to its end (or ``now``, else its last
    event)."""
    rows = sorted((d for d in docs), key=lambda d: float(d["time"]))
    mine = [d for d in rows if d["data"].get("job_id") == job_id]
    starts = [float(d["time"]) for d in mine if d["type"] == T_STARTED]
    if not starts:
        return JobAccounting(0.0, 0.0, 0, 0)
    submitted = next((float(d["time"]) for d in mine if d["type"] == T_SUBMITTED), starts[0])
    finished = next((float(d["time"]) for d in mine if d["type"] == T_FINISHED), None)
    last = float(rows[-1]["time"])
    end = finished if finished is not None else max(last, now if now is not None else last)
    params = infer_params(mine, job_id, nodes)
    jg = account(rows, params={job_id: params}, start=min(submitted, starts[0]),
                 end=end).jobs[job_id]
    recovery = sum(v for (cat, cause), v in jg.badput.items()
                   if cause not in _ROUTINE_CAUSES
                   and cat is not Badput.WASTED_PROGRESS_FROM_DISRUPTION)
    wasted = jg.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION)
    lost_steps = round(wasted / params.step_time_s) if params.step_time_s > 0 else 0
    return JobAccounting(wall_s=max(0.0, end - starts[0]), recovery_s=recovery,
                         lost_steps=lost_steps, restarts=len(set(starts)) - 1, goodput=jg)
