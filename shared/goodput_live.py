"""Goodput of one job of the live system, read from its event log.

Wall time runs from the job's first start to its end. Recovery is every second between an
attempt's workers exiting on an interruption and the next attempt starting, plus the time
from the diagnosis that interrupted it to that exit (the checkpoint on SIGTERM). Lost work is
what a resumed attempt had to recompute: the newest step any earlier attempt reached (as its
checkpoints show) minus the step the new attempt resumed from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobAccounting:
    wall_s: float
    recovery_s: float
    lost_steps: int
    restarts: int

    @property
    def productive_s(self) -> float:
        return max(0.0, self.wall_s - self.recovery_s)

    @property
    def runtime_goodput(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0


def job_accounting(docs: Iterable[dict[str, Any]], job_id: str) -> JobAccounting:
    starts: dict[int, tuple[float, int]] = {}
    exits: dict[int, float] = {}
    max_step: dict[int, int] = {}
    finished_at: float | None = None
    job_nodes: set[str] = set()
    interrupt_at: dict[int, float] = {}
    diagnoses: list[tuple[float, str]] = []
    for doc in sorted(docs, key=lambda d: d["time"]):
        data, t = doc["data"], doc["time"]
        if doc["type"] == "mtc.node.diagnosed.v1":
            diagnoses.append((t, data["node_id"]))
        if data.get("job_id") != job_id:
            continue
        match doc["type"]:
            case "mtc.job.started.v1":
                starts[data["attempt"]] = (t, data.get("resume_step", -1))
                job_nodes = set(data["node_ids"])
                attempt = data["attempt"]
                diagnoses = []
            case "mtc.node.draining.v1" | "mtc.job.interrupt_requested.v1":
                attempt = max(starts) if starts else 0
                first = next((dt for dt, n in diagnoses if n in job_nodes), t)
                interrupt_at.setdefault(attempt, first)
            case "mtc.job.checkpoint_saved.v1":
                a = data["attempt"]
                max_step[a] = max(max_step.get(a, -1), data["step"])
            case "mtc.job.workers_exited.v1":
                exits[data["attempt"]] = t
            case "mtc.job.finished.v1":
                finished_at = t
    if not starts:
        return JobAccounting(0.0, 0.0, 0, 0)
    first_start = min(t for t, _ in starts.values())
    end = finished_at if finished_at is not None else max([*exits.values(), first_start])
    recovery = 0.0
    lost = 0
    for attempt in sorted(starts)[1:]:
        prev = attempt - 1
        started, resume_step = starts[attempt]
        exited = exits.get(prev, started)
        recovery += max(0.0, started - interrupt_at.get(prev, exited))
        reached = max((s for a, s in max_step.items() if a < attempt), default=-1)
        lost += max(0, reached - max(resume_step, 0)) if reached >= 0 else 0
    return JobAccounting(end - first_start, recovery, lost, len(starts) - 1)
