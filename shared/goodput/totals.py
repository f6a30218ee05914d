"""What the goodput accounting produces: the badput categories and the per-job and fleet
totals, with the three goodput factors and ETTR as properties of the totals.

The three factors are Google's ML Productivity Goodput, goodput = scheduling goodput x runtime
goodput x program goodput ("Introducing ML Productivity Goodput: a metric to measure AI system
efficiency", Google Cloud blog, 2024-04-10,
https://cloud.google.com/blog/products/ai-machine-learning/goodput-metric-as-measure-of-ml-productivity).
The badput category names follow ``BadputType`` of Google's calculator, ml-goodput-measurement
(https://github.com/AI-Hypercomputer/ml-goodput-measurement, ``goodput_utils.py``), with
``WAITING_FOR_CAPACITY`` and ``PROGRAM_SLOWDOWN`` added for the scheduling and program factors.
ETTR, the effective training time ratio, is Meta's (Kokolis et al., "Revisiting Reliability in
Large-Scale Machine Learning Research Clusters", arXiv:2410.21680, 2024).

How a log becomes these totals is :mod:`shared.goodput.accounting`.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

# what a report prints beside an ETTR figure (Meta's "effective training time ratio")
ETTR_MEANS = ("ETTR (effective training time ratio): the share of the job's wall time spent "
              "in steps that count, not waiting for capacity, recovering, recomputing lost "
              "steps or saving")


class Badput(enum.StrEnum):
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"
    INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION = "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"
    PROGRAM_STARTUP = "PROGRAM_STARTUP"
    UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME = "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"
    UNPRODUCTIVE_CHECKPOINT_SAVE_TIME = "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"
    WASTED_PROGRESS_FROM_DISRUPTION = "WASTED_PROGRESS_FROM_DISRUPTION"
    PROGRAM_SLOWDOWN = "PROGRAM_SLOWDOWN"
    OTHER = "OTHER"


SCHEDULING = frozenset({Badput.WAITING_FOR_CAPACITY})
PROGRAM = frozenset({Badput.PROGRAM_SLOWDOWN})


@dataclass(frozen=True)
class JobParams:
    """What the event log cannot know about a job: its nominal costs."""

    step_time_s: float
    checkpoint_save_s: float
    checkpoint_restore_s: float
    startup_s: float
    mfu: float = 1.0
    checkpoint_interval_s: float = 1800.0
    nodes: int = 1
    all_checkpoints: bool = False  # every checkpoint is logged (else only the newest ones)
    # each attempt's startup (+ restore) measured from its first checkpoint, not the nominal
    # figure: the live system knows no nominal figure, and a slow restart shows up as such
    measure_startup: bool = False
    # restore seconds by checkpoint tier (``JobCheckpointSaved.tier``): an attempt resumed
    # from a checkpoint of a listed tier restores in that long (else checkpoint_restore_s)
    restore_by_tier: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Disruption:
    at: float
    attempt: int
    cause: str
    failure_mode: str
    graceful: bool


@dataclass
class JobGoodput:
    job_id: str
    params: JobParams
    start: float = 0.0
    end: float = 0.0
    productive_s: float = 0.0  # kept compute (wall)
    nominal_s: float = 0.0  # kept steps x nominal step time
    attempts: int = 0
    badput: dict[tuple[Badput, str], float] = field(default_factory=lambda: defaultdict(float))
    disruptions: list[Disruption] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return max(0.0, self.end - self.start)

    def lost(self, category: Badput | None = None, cause: str | None = None) -> float:
        return sum(v for (cat, c), v in self.badput.items()
                   if (category is None or cat is category) and (cause is None or c == cause))

    def by_category(self) -> dict[str, float]:
        out: dict[str, float] = {b.value: 0.0 for b in Badput}
        for (cat, _), v in self.badput.items():
            out[cat.value] += v
        return out

    def by_cause(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for (_, cause), v in self.badput.items():
            out[cause] += v
        return dict(out)

    @property
    def scheduling_goodput(self) -> float:
        total = self.total_s
        return (total - self.lost(Badput.WAITING_FOR_CAPACITY)) / total if total else 0.0

    @property
    def runtime_goodput(self) -> float:
        held = self.total_s - self.lost(Badput.WAITING_FOR_CAPACITY)
        return self.productive_s / held if held > 0 else 0.0

    @property
    def program_goodput(self) -> float:
        if self.productive_s <= 0:
            return 0.0
        return self.params.mfu * min(1.0, self.nominal_s / self.productive_s)

    @property
    def goodput(self) -> float:
        return self.scheduling_goodput * self.runtime_goodput * self.program_goodput

    @property
    def ettr(self) -> float:
        """Meta's effective training time ratio: productive time / wall time."""
        return self.productive_s / self.total_s if self.total_s else 0.0

    def interruptions(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for d in self.disruptions:
            out[d.cause] += 1
        return dict(out)

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_s": self.total_s, "productive_s": self.productive_s,
            "nominal_s": self.nominal_s, "attempts": self.attempts,
            "disruptions": len(self.disruptions),
            "scheduling_goodput": self.scheduling_goodput,
            "runtime_goodput": self.runtime_goodput, "program_goodput": self.program_goodput,
            "goodput": self.goodput, "ettr": self.ettr,
            "badput_s": {k: v for k, v in self.by_category().items() if v},
            "badput_by_cause_s": dict(sorted(self.by_cause().items())),
            "interruptions": dict(sorted(self.interruptions().items())),
        }


@dataclass
class FleetGoodput:
    gpus: int
    window_s: float
    job_gpu_s: float = 0.0
    productive_gpu_s: float = 0.0
    nominal_gpu_s: float = 0.0
    effective_gpu_s: float = 0.0  # nominal x MFU: what the hardware really delivered
    badput_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def capacity_gpu_s(self) -> float:
        return self.gpus * self.window_s

    @property
    def idle_gpu_s(self) -> float:
        """Capacity held by no job: spares, idle nodes, nodes out for repair."""
        return max(0.0, self.capacity_gpu_s - self.job_gpu_s)

    @property
    def goodput(self) -> float:
        cap = self.capacity_gpu_s
        return self.effective_gpu_s / cap if cap else 0.0

    @property
    def utilization(self) -> float:
        cap = self.capacity_gpu_s
        return self.productive_gpu_s / cap if cap else 0.0

    def as_dict(self) -> dict[str, Any]:
        hours = 1.0 / 3600.0
        return {
            "gpus": self.gpus, "capacity_gpu_h": self.capacity_gpu_s * hours,
            "job_gpu_h": self.job_gpu_s * hours, "productive_gpu_h": self.productive_gpu_s * hours,
            "idle_gpu_h": self.idle_gpu_s * hours, "goodput": self.goodput,
            "productive_share": self.utilization,
            "badput_gpu_h": {k: v * hours for k, v in sorted(self.badput_gpu_s.items()) if v},
        }


@dataclass
class Accounting:
    jobs: dict[str, JobGoodput]
    fleet: FleetGoodput
