"""Per-job accounting for the console, from the live event log: restarts, recovery and lost
work, and the three goodputs with badput by cause, all from ``shared.goodput`` (the accounting
the twin uses; the job's nominal costs are measured from its own log there). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.domain.model import Job
from shared.goodput import JobAccounting, JobGoodput, job_accounting


def accounting(docs: Sequence[Mapping[str, Any]], jobs: Sequence[Job], now: float
               ) -> dict[str, tuple[JobAccounting, JobGoodput | None]]:
    """Each job's live accounting and, once it has started, its goodput factors."""
    out: dict[str, tuple[JobAccounting, JobGoodput | None]] = {}
    rows = [dict(d) for d in docs]
    for job in jobs:
        end = job.ended_at if job.ended_at is not None else now
        acct = job_accounting(rows, job.job_id, now=end,
                              nodes=len([n for n in job.node_ids if n]))
        out[job.job_id] = (acct, acct.goodput if job.started_at is not None else None)
    return out
