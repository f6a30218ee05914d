"""Per-job accounting for the console, from the live event log: restarts, recovery and lost
work (``shared.goodput_live``), and the three goodputs with badput by cause
(``simulator.goodput``, the accounting the twin uses).

The live log does not know a job's nominal costs (step time, checkpoint save and restore,
startup), so they are read off it: the step time is the job's own pace between its
checkpoints, the costs are taken as zero (their time shows up as recovery instead). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.domain.model import Job
from shared.goodput_live import JobAccounting, job_accounting
from simulator.goodput import JobGoodput, JobParams, account

CKPT = "mtc.job.checkpoint_saved.v1"


def step_time(docs: Iterable[Mapping[str, Any]], job_id: str) -> float:
    """Seconds per step, from the job's checkpoints within one attempt (1.0 without two)."""
    by_attempt: dict[int, list[tuple[float, int]]] = {}
    for d in docs:
        data = d["data"]
        if d["type"] == CKPT and data.get("job_id") == job_id:
            by_attempt.setdefault(int(data["attempt"]), []).append(
                (float(data.get("saved_at", d["time"])), int(data["step"])))
    best = 0.0, 0
    for points in by_attempt.values():
        points.sort()
        span, steps = points[-1][0] - points[0][0], points[-1][1] - points[0][1]
        if steps > best[1] and span > 0:
            best = span, steps
    return best[0] / best[1] if best[1] else 1.0


def accounting(docs: Sequence[Mapping[str, Any]], jobs: Sequence[Job], now: float
               ) -> dict[str, tuple[JobAccounting, JobGoodput | None]]:
    """Each job's live accounting and, once it has started, its goodput factors."""
    out: dict[str, tuple[JobAccounting, JobGoodput | None]] = {}
    rows = [dict(d) for d in docs]
    for job in jobs:
        acct = job_accounting(rows, job.job_id)
        goodput = None
        if job.started_at is not None:
            params = JobParams(step_time_s=step_time(rows, job.job_id), checkpoint_save_s=0.0,
                               checkpoint_restore_s=0.0, startup_s=0.0, all_checkpoints=True,
                               nodes=max(1, len([n for n in job.node_ids if n])))
            end = job.ended_at if job.ended_at is not None else now
            result = account(rows, params={job.job_id: params}, start=job.created_at,
                             end=max(end, job.created_at))
            goodput = result.jobs[job.job_id]
        out[job.job_id] = (acct, goodput)
    return out
