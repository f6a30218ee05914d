"""Checkpoint interval: the classic models, and a recommendation from observed interruptions.

Checkpointing too often wastes time writing; too rarely wastes work redone after a failure.
Young and Daly balance the two from the checkpoint cost and the mean time between
interruptions: J. W. Young, "A first order approximation to the optimum checkpoint interval",
CACM 17(9), 1974; J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
restart dumps", FGCS 22(3), 2006. All times are seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mtc_program import protocol as p

__all__ = [
    "CheckpointAdvice",
    "CheckpointPolicy",
    "advise",
    "daly_interval",
    "first_order_waste",
    "meta_ettr",
    "meta_ettr_at_scale",
    "meta_job_mttf_s",
    "observed_mtbf",
    "recommend_interval",
    "young_interval",
]

LLAMA3_MTBF_S = 3.1 * 3600.0  # one unexpected interruption every 3.1 h on 16k H100s


def _positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")


def young_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: sqrt(2 * delta * M)."""
    _positive("checkpoint_cost_s", checkpoint_cost_s)
    _positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum; when a checkpoint costs 2M or more, checkpoint every M."""
    _positive("checkpoint_cost_s", checkpoint_cost_s)
    _positive("mtbf_s", mtbf_s)
    if checkpoint_cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = checkpoint_cost_s / (2.0 * mtbf_s)
    return (
        math.sqrt(2.0 * checkpoint_cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0)
        - checkpoint_cost_s
    )


def first_order_waste(
    interval_s: float, checkpoint_cost_s: float, restart_cost_s: float, mtbf_s: float
) -> float:
    """Fraction of time lost: delta/tau for writing, (tau/2 + R)/M for failures."""
    _positive("interval_s", interval_s)
    _non_negative("checkpoint_cost_s", checkpoint_cost_s)
    _non_negative("restart_cost_s", restart_cost_s)
    _positive("mtbf_s", mtbf_s)
    return checkpoint_cost_s / interval_s + (interval_s / 2.0 + restart_cost_s) / mtbf_s


def meta_ettr(
    nodes: int,
    failure_rate_per_node_s: float,
    restart_overhead_s: float,
    interval_s: float,
    write_time_s: float,
) -> float:
    """Meta's expected ETTR: (1 - N r (u0 + D/2)) / (1 + w/D), floored at 0.

    The model is first order; when failures are so frequent that it goes negative the job
    makes no progress, hence the floor.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
    _non_negative("failure_rate_per_node_s", failure_rate_per_node_s)
    _non_negative("restart_overhead_s", restart_overhead_s)
    _positive("interval_s", interval_s)
    _non_negative("write_time_s", write_time_s)
    lost = nodes * failure_rate_per_node_s * (restart_overhead_s + interval_s / 2.0)
    return max(0.0, (1.0 - lost) / (1.0 + write_time_s / interval_s))


def meta_job_mttf_s(gpus: int, failures_per_1000_node_days: float,
                    gpus_per_node: int = 8) -> float:
    """A job's mean time to failure when any of its nodes failing kills it.

    Kokolis et al. (arXiv:2410.21680) model a job as its nodes in series with a constant
    per-node failure rate, so the job's MTTF is 1 / (nodes x rate): it halves each time the job
    doubles.
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node!r}")
    _positive("failures_per_1000_node_days", failures_per_1000_node_days)
    nodes = math.ceil(gpus / gpus_per_node)
    return 1000.0 * 86_400.0 / (failures_per_1000_node_days * nodes)


def meta_ettr_at_scale(gpus: int, failures_per_1000_node_days: float, *,
                       interval_s: float, write_time_s: float, restart_overhead_s: float,
                       gpus_per_node: int = 8) -> float:
    """Meta's expected ETTR for a job of ``gpus`` GPUs: :func:`meta_ettr` at the job's node count
    and the cluster's per-node failure rate (failures per 1,000 node-days, the unit the study
    reports its clusters' rates in), the form its ETTR-versus-job-size curves are drawn from."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node!r}")
    _non_negative("failures_per_1000_node_days", failures_per_1000_node_days)
    nodes = math.ceil(gpus / gpus_per_node)
    rate_per_node_s = failures_per_1000_node_days / (1000.0 * 86_400.0)
    return meta_ettr(nodes, rate_per_node_s, restart_overhead_s, interval_s, write_time_s)


def observed_mtbf(
    interruption_times: Sequence[float], window_start: float, now: float
) -> float | None:
    """Window length / interruptions in [window_start, now]; None when none were seen."""
    if not now > window_start:
        raise ValueError(f"now ({now}) must be after window_start ({window_start})")
    count = sum(1 for t in interruption_times if window_start <= t <= now)
    if count == 0:
        return None
    return (now - window_start) / count


@dataclass(frozen=True)
class CheckpointPolicy:
    """Bounds on the recommended interval, and the MTBF assumed before any interruption.

    The default MTBF is Llama 3's (3.1 h at 16k GPUs): pessimistic for small jobs, which then
    checkpoint a little more often than needed, the cheap side to err on.
    """

    min_interval_s: float = 60.0
    max_interval_s: float = 4 * 3600.0
    default_mtbf_s: float = LLAMA3_MTBF_S

    def __post_init__(self) -> None:
        _positive("min_interval_s", self.min_interval_s)
        _positive("max_interval_s", self.max_interval_s)
        _positive("default_mtbf_s", self.default_mtbf_s)
        if self.max_interval_s < self.min_interval_s:
            raise ValueError(
                f"max_interval_s ({self.max_interval_s}) must not be below "
                f"min_interval_s ({self.min_interval_s})"
            )


def recommend_interval(
    cost_s: float,
    interruption_times: Sequence[float],
    window_start: float,
    now: float,
    policy: CheckpointPolicy,
) -> float:
    """Daly's interval for the observed MTBF (the policy default if none), clamped."""
    mtbf = observed_mtbf(interruption_times, window_start, now)
    interval = daly_interval(cost_s, policy.default_mtbf_s if mtbf is None else mtbf)
    return min(policy.max_interval_s, max(policy.min_interval_s, interval))


@dataclass(frozen=True)
class CheckpointAdvice:
    """The checkpoint interval a job's own history calls for, and what it was computed from.

    ``basis`` says where the MTBF came from: ``observed`` (the job's interruptions over its
    running time) or ``default`` (none yet: the policy's assumed MTBF)."""

    interval_s: float
    mtbf_s: float
    save_s: float
    interruptions: int
    running_s: float
    basis: str
    at: float

    def as_dict(self) -> dict[str, float | int | str]:
        return {"interval_s": self.interval_s, "mtbf_s": self.mtbf_s, "save_s": self.save_s,
                "interruptions": self.interruptions, "running_s": self.running_s,
                "basis": self.basis, "at": self.at}

    def env(self) -> dict[str, str]:
        """The environment file a program reads (``MTC_ADVICE_FILE``): seconds, as text."""
        return {p.ADVICE_INTERVAL_S: f"{self.interval_s:.1f}",
                p.ADVICE_MTBF_S: f"{self.mtbf_s:.1f}",
                p.ADVICE_SAVE_S: f"{self.save_s:.3f}",
                p.ADVICE_INTERRUPTIONS: str(self.interruptions),
                p.ADVICE_BASIS: self.basis,
                p.ADVICE_AT: f"{self.at:.3f}"}


def advise(save_costs: Sequence[float], interruptions: int, running_s: float, now: float,
           policy: CheckpointPolicy) -> CheckpointAdvice | None:
    """Daly's interval from the job's fitted MTBF (its running time / its interruptions) and
    its measured save cost (the median of the saves it timed), clamped by ``policy``.

    None when no save was measured: an interval from a guessed cost would be advice without
    a basis."""
    costs = sorted(c for c in save_costs if math.isfinite(c) and c > 0)
    if not costs:
        return None
    if interruptions < 0:
        raise ValueError(f"interruptions must not be negative, got {interruptions!r}")
    _non_negative("running_s", running_s)
    n = len(costs)
    cost = costs[n // 2] if n % 2 else (costs[n // 2 - 1] + costs[n // 2]) / 2
    observed = interruptions > 0 and running_s > 0
    mtbf = running_s / interruptions if observed else policy.default_mtbf_s
    interval = min(policy.max_interval_s, max(policy.min_interval_s, daly_interval(cost, mtbf)))
    return CheckpointAdvice(interval, mtbf, cost, interruptions, running_s,
                            "observed" if observed else "default", now)
