"""The failure model: what breaks, how often, what the node agent then reports, what fixes it.

Calibration. Rates are counts per node-day, taken from the Llama 3 405B pretraining figures in
Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783 (2024), section 3.3.4 and
Table 5 (root causes of the unexpected interruptions in a 54-day snapshot): 419 unexpected
interruptions on 2,048 nodes of 8 H100 over 54 days, about 3.8 per 1,000 node-days, and 47
planned ones, with more than 90% effective training time. A scenario lists each cause
with its published ``count`` and the ``reference`` node-days it was observed over; the rate of a
cause is ``count / (nodes x days) x rate_scale``.

Each cause produces *health signals*, never a decision: an XID code, ECC counts, a row-remap
failure, a failed DCGM level, disk pressure, a thermal reading, a slow speed check or a lost
heartbeat. The twin turns them into ``NodeHealthReported`` conditions, so the real triage table
decides what they mean. Each cause also has a *true fix*: the cheapest repair that really clears
it (``none`` for a software crash that a job restart survives). A cheaper repair does not fix it:
the node fails its post-repair check (or does not come back at all when the node is down) and
the real repair ladder has to climb.

Options: exponential or Weibull node lifetimes (renewed when a repair clears a fault), lemon
nodes (a fraction with a multiplied rate, normalised so the fleet average keeps the calibrated
rate), planned maintenance (job-level checkpoint-and-restart), a diurnal program slowdown and
stragglers (a node that runs slow for a while, reported by the speed check).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared.domain.health import Condition, ConditionStatus, ConditionType, RepairAction
from shared.policies.ranking import action_rank
from simulator.readers import Dist
from simulator.streams import FAILURES_DOMAIN, Streams

# ---------------------------------------------------------------- published Llama 3 figures
# arXiv:2407.21783, section 3.3.4 and Table 5

LLAMA3_NODES = 2048
LLAMA3_GPUS_PER_NODE = 8
LLAMA3_DAYS = 54.0
LLAMA3_PLANNED = 47
LLAMA3_EFFECTIVE_TRAINING_TIME = 0.90  # "more than 90% effective training time"
# cause key -> (paper label, category, unexpected interruptions)
LLAMA3_UNEXPECTED: dict[str, tuple[str, str, int]] = {
    "faulty_gpu": ("faulty GPU", "GPU", 148),
    "gpu_hbm3": ("GPU HBM3 memory", "GPU", 72),
    "software_bug": ("software bug", "dependency", 54),
    "network": ("network switch/cable", "network", 35),
    "host_maintenance": ("host maintenance (unplanned)", "maintenance", 32),
    "gpu_sram": ("GPU SRAM memory", "GPU", 19),
    "gpu_system_processor": ("GPU system processor", "GPU", 17),
    "nic": ("NIC", "host", 7),
    "nccl_watchdog": ("NCCL watchdog timeouts", "unknown", 7),
    "silent_data_corruption": ("silent data corruption", "GPU", 6),
    "gpu_thermal": ("GPU thermal interface + sensor", "GPU", 6),
    "ssd": ("SSD", "host", 3),
    "power_supply": ("power supply", "host", 3),
    "server_chassis": ("server chassis", "host", 2),
    "io_expansion_board": ("IO expansion board", "host", 2),
    "dependency": ("dependency", "dependency", 2),
    "cpu": ("CPU", "host", 2),
    "system_memory": ("system memory", "host", 2),
}
LLAMA3_UNEXPECTED_TOTAL = sum(c for _, _, c in LLAMA3_UNEXPECTED.values())  # 419

FIXES = ("none", "reset_gpu", "reboot", "reimage", "replace")
RACK_GROUP = 0  # a variant's ``group: rack``: the struck node's whole rack fails with it


# ---------------------------------------------------------------- signals


@dataclass(frozen=True)
class Signal:
    """What the node agent (or the heartbeat monitor) sees when a fault happens."""

    xids: tuple[int, ...] = ()
    ecc_dbe: int = 0
    row_remap_failure: bool = False
    dcgm_level: int = 0
    disk_used: float = 0.0
    thermal_c: float = 0.0
    speed_ratio: float = 0.0
    heartbeat: bool = False  # the node went silent: the heartbeat monitor reports it

    @property
    def empty(self) -> bool:
        return self == _NOTHING_SEEN  # (a constant: not a new Signal per question)

    @property
    def node_down(self) -> bool:
        """A dead or unreachable node: it cannot run a cheaper repair, nor a job."""
        return self.heartbeat

    @property
    def blocks_launch(self) -> bool:
        """Workers started on the node fail (a missing GPU, a DBE, a read-only disk); a node
        with silent corruption or a slow clock runs them."""
        return bool(self.heartbeat or self.xids or self.ecc_dbe or self.row_remap_failure
                    or self.disk_used >= 0.98)

    @property
    def detection(self) -> str:
        """Which detection delay applies (``scenario.detection`` key)."""
        if self.heartbeat:
            return "heartbeat"
        if self.xids:
            return "xid"
        if self.ecc_dbe or self.row_remap_failure:
            return "ecc"
        if self.dcgm_level:
            return "dcgm"
        if self.disk_used:
            return "disk"
        if self.thermal_c:
            return "thermal"
        return "speed"


_NOTHING_SEEN = Signal()  # the signal of a fault that no check sees


def fault_conditions(signal: Signal, fault_at: float, observed_at: float,
                     cause: str) -> tuple[dict[str, Any], ...]:
    """The TRUE conditions a report carries for ``signal``. ``since`` is when the fault
    happened (the kernel log timestamp, the last heartbeat); ``details.cause`` names the
    simulated root cause for the goodput accounting (triage ignores unknown detail keys)."""
    out: list[Condition] = []
    t = ConditionStatus.TRUE
    if signal.xids:
        codes = list(signal.xids)
        out.append(Condition(ConditionType.XID_ERROR.value, t,
                             "Xid " + ", ".join(map(str, codes)), fault_at,
                             {"xids": codes, "gpus": ["0000:1b:00.0"], "cause": cause}))
    if signal.ecc_dbe:
        out.append(Condition(ConditionType.ECC_UNCORRECTABLE.value, t, "uncorrectable ECC",
                             fault_at, {"volatile_dbe": signal.ecc_dbe,
                                        "aggregate_dbe": signal.ecc_dbe, "cause": cause}))
    if signal.row_remap_failure:
        out.append(Condition(ConditionType.ROW_REMAP_FAILURE.value, t, "row remapping failed",
                             fault_at, {"failure": True, "pending": False, "cause": cause}))
    if signal.dcgm_level:
        out.append(Condition(ConditionType.DCGM_DIAG_FAILED.value, t,
                             f"dcgmi diag -r {signal.dcgm_level} failed", fault_at,
                             {"level": signal.dcgm_level, "failed_tests": ["memtest"],
                              "cause": cause}))
    if signal.disk_used:
        out.append(Condition(ConditionType.DISK_PRESSURE.value, t, "disk nearly full",
                             fault_at, {"mount": "/", "used_fraction": signal.disk_used,
                                        "cause": cause}))
    if signal.thermal_c:
        out.append(Condition(ConditionType.THERMAL_THROTTLING.value, t, "HW thermal slowdown",
                             fault_at, {"temperature_c": signal.thermal_c,
                                        "reasons": ["HW Thermal Slowdown"], "cause": cause}))
    if signal.speed_ratio:
        out.append(Condition(ConditionType.SLOW_SPEED_CHECK.value, t, "slow speed check",
                             fault_at, {"ratio_to_baseline": signal.speed_ratio,
                                        "cause": cause}))
    if signal.heartbeat:
        silent = max(0.0, observed_at - fault_at)
        out.append(Condition(ConditionType.HEARTBEAT_LOST.value, t,
                             f"no report for {silent:.0f} s", observed_at,
                             {"silent_for_s": silent, "cause": cause}))
    return tuple(c.to_dict() for c in out)


_HEALTHY_TYPES = tuple(t.value for t in ConditionType if t is not ConditionType.HEARTBEAT_LOST)


def healthy_conditions(observed_at: float) -> tuple[dict[str, Any], ...]:
    """A full agent report in which every check ran and found nothing."""
    return tuple([{"type": t, "status": "false", "reason": "checked", "since": observed_at,
                   "details": {}} for t in _HEALTHY_TYPES])  # (a list: no generator frame)



# ---------------------------------------------------------------- causes


@dataclass(frozen=True)
class Variant:
    weight: float
    signal: Signal
    fix: tuple[tuple[str, float], ...]  # (true fix, probability)
    group: int  # nodes that fail together (a leaf switch, a rack PDU); RACK_GROUP: its rack


@dataclass(frozen=True)
class Cause:
    name: str
    label: str
    category: str
    rate_per_node_day: float
    variants: tuple[Variant, ...]
    kills_job: bool  # the running attempt dies at once (progress since the checkpoint is lost)
    hang: bool  # ranks hang until the NCCL watchdog instead of crashing at once
    # its node's ranks compute this many times slower until a repair clears it (1.0: not a
    # slowdown; a straggler its own checks may not see: a job's per-rank progress does)
    slows: float = 1.0


@dataclass(frozen=True)
class Lifetime:
    kind: str  # exponential | weibull
    shape: float  # Weibull shape k (k < 1: infant mortality, k > 1: wear-out)


@dataclass(frozen=True)
class Lemons:
    fraction: float
    multiplier: float


@dataclass(frozen=True)
class Planned:
    rate_per_day: float  # job-level planned restarts (checkpoint, stop, resume)
    periodic: bool


@dataclass(frozen=True)
class Diurnal:
    amplitude: float  # peak-to-trough loss of speed (0.015: 1.5% slower at the hottest hour)
    peak_hour: float


@dataclass(frozen=True)
class Stragglers:
    rate_per_node_day: float
    ratio: Dist  # speed relative to nominal while slow (0.7: 30% slower)
    duration: Dist  # how long it stays slow unless a repair clears it
    report_interval_s: float


@dataclass(frozen=True)
class ScriptedFault:
    """A fault at a fixed time on a fixed node slot (traces, regression cases, formulas)."""

    at_s: float  # simulated seconds after the cluster is ready
    node: int  # the slot's index in its partition (the original node, not a replacement)
    partition: str | None  # None: the first partition
    cause: str  # a key of ``failures.causes``
    variant: int | None  # which of the cause's variants; None: drawn by weight
    fix: str | None  # force the true fix; None: drawn from the variant's


@dataclass(frozen=True)
class FailureCfg:
    causes: tuple[Cause, ...]
    lifetime: Lifetime
    lemons: Lemons
    planned: Planned
    diurnal: Diurnal
    stragglers: Stragglers
    rate_scale: float
    reference_node_days: float
    scripted: tuple[ScriptedFault, ...] = ()

    @property
    def rate_per_node_day(self) -> float:
        return sum(c.rate_per_node_day for c in self.causes)


# ---------------------------------------------------------------- sampling


def fix_rank(fix: str) -> int:
    """How disruptive the cheapest sufficient repair is, on the control plane's own scale."""
    return -1 if fix == "none" else action_rank(RepairAction(fix))


def repair_fixes(action: RepairAction, fix: str) -> bool:
    return fix == "none" or action_rank(action) >= fix_rank(fix)


@dataclass(frozen=True)
class Fault:
    """One occurrence of a cause on one node."""

    cause: Cause
    signal: Signal
    fix: str
    at: float  # simulated seconds
    group: int = 1


class NodeStream:
    """One node's failure randomness: its rate multiplier and its fault arrivals."""

    __slots__ = ("multiplier", "next_at", "rng")

    def __init__(self, rng: np.random.Generator, multiplier: float) -> None:
        self.rng = rng
        self.multiplier = multiplier
        self.next_at = math.inf


class FailureModel:
    """Samples lifetimes, causes and true fixes; owns nothing about the control plane.

    Every node draws from its own stream (:class:`Streams`, keyed by node id). With
    exponential lifetimes the faults of a node are a Poisson process of arrivals that does
    not depend on what happens to the node: an arrival while the node is already broken, in
    repair or down finds nothing to break and is dropped, so the failure times of a node are
    the same whatever the repair times, the spares or the fleet size. Weibull lifetimes have
    an age, which a repair that clears the fault renews: there the next fault is drawn from
    the repair (or the transient fault) on."""

    def __init__(self, cfg: FailureCfg, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.streams = Streams.from_rng(rng)
        rates = np.array([c.rate_per_node_day for c in cfg.causes], dtype=float)
        self.total_rate = float(rates.sum())  # per node-day, fleet average
        self._cum = np.cumsum(rates / self.total_rate) if self.total_rate > 0 else np.array([])
        lem = cfg.lemons
        # normalise so that the fleet average stays the calibrated rate
        self._base = 1.0 / (1.0 - lem.fraction + lem.fraction * lem.multiplier)
        self.renewing = cfg.lifetime.kind == "weibull"

    def node_stream(self, node_id: str, *, replacement: bool) -> NodeStream:
        rng = self.streams.rng(FAILURES_DOMAIN, node_id)
        lem = self.cfg.lemons
        lemon = rng.random() < lem.fraction and not replacement and lem.fraction > 0
        return NodeStream(rng, self._base * (lem.multiplier if lemon else 1.0))

    def lifetime_s(self, stream: NodeStream) -> float:
        """Seconds until the next fault of a node (its rate is ``multiplier`` x average)."""
        rate_per_s = self.total_rate * stream.multiplier / 86_400.0
        if rate_per_s <= 0:
            return math.inf
        mean = 1.0 / rate_per_s
        if self.cfg.lifetime.kind == "weibull":
            k = self.cfg.lifetime.shape
            return float(mean / math.gamma(1.0 + 1.0 / k) * stream.rng.weibull(k))
        return float(stream.rng.exponential(mean))

    def fault(self, stream: NodeStream, at: float) -> Fault:
        rng = stream.rng
        index = int(np.searchsorted(self._cum, rng.random(), side="right"))
        return self.fault_of(self.cfg.causes[min(index, len(self.cfg.causes) - 1)], at, rng)

    def fault_of(self, cause: Cause, at: float, rng: np.random.Generator,
                 variant: int | None = None, fix: str | None = None) -> Fault:
        """A fault of ``cause`` (a scripted one may name its variant and force its fix)."""
        chosen = (_pick(cause.variants, [v.weight for v in cause.variants], rng)
                  if variant is None else cause.variants[variant])
        if fix is None:
            fix = _pick([f for f, _ in chosen.fix], [p for _, p in chosen.fix], rng)
        return Fault(cause, chosen.signal, fix, at, chosen.group)


def _pick(items: Sequence[Any], weights: Sequence[float], rng: np.random.Generator) -> Any:
    if len(items) == 1:
        return items[0]
    u = rng.random() * sum(weights)
    acc = 0.0
    for item, w in zip(items, weights, strict=True):
        acc += w
        if u < acc:
            return item
    return items[-1]


# ---------------------------------------------------------------- program speed

DAY_S = 86_400.0
_OMEGA = 2.0 * math.pi / DAY_S


def diurnal_speed(cfg: Diurnal, t: float, epoch_s: float) -> float:
    """Relative speed at simulated time ``t``: 1 - A at the peak hour, 1 at the coolest."""
    if cfg.amplitude == 0:
        return 1.0
    phase = (t + epoch_s) - cfg.peak_hour * 3600.0
    return 1.0 - cfg.amplitude * (1.0 + math.cos(_OMEGA * phase)) / 2.0


def diurnal_integral(cfg: Diurnal, t0: float, t1: float, epoch_s: float) -> float:
    """Integral of :func:`diurnal_speed` over [t0, t1] (closed form)."""
    if t1 <= t0:
        return 0.0
    if cfg.amplitude == 0:
        return t1 - t0
    a = cfg.amplitude
    p0 = (t0 + epoch_s) - cfg.peak_hour * 3600.0
    p1 = (t1 + epoch_s) - cfg.peak_hour * 3600.0
    return (1.0 - a / 2.0) * (t1 - t0) - a / 2.0 * (math.sin(_OMEGA * p1)
                                                   - math.sin(_OMEGA * p0)) / _OMEGA


def diurnal_spans(cfg: Diurnal, start: float, first: int, stop: int, span: float,
                  period: float, epoch_s: float) -> list[float]:
    """``diurnal_integral(cfg, c, c + span, epoch_s)`` for each ``c = start + k * period``,
    ``k`` in ``range(first, stop)``: the same numbers, bit for bit, without two calls per
    span (a job's compute between checkpoints: a 128-job year has two million of them)."""
    if cfg.amplitude == 0:
        return [(c + span) - c for c in [start + k * period for k in range(first, stop)]]
    a = cfg.amplitude
    level, swing, peak, sin, omega = 1.0 - a / 2.0, a / 2.0, cfg.peak_hour * 3600.0, math.sin, _OMEGA
    return [0.0 if t1 <= t0 else
            level * (t1 - t0) - swing * (sin(omega * ((t1 + epoch_s) - peak))
                                         - sin(omega * ((t0 + epoch_s) - peak))) / omega
            for t0 in [start + k * period for k in range(first, stop)]
            for t1 in [t0 + span]]


def rates_table(cfg: FailureCfg) -> list[tuple[str, str, float]]:
    """(cause, category, failures per 1,000 node-days) for reports."""
    return [(c.name, c.category, c.rate_per_node_day * 1000.0) for c in cfg.causes]


def by_category(counts: Mapping[str, float], cfg: FailureCfg) -> dict[str, float]:
    cat = {c.name: c.category for c in cfg.causes}
    out: dict[str, float] = {}
    for name, n in counts.items():
        out[cat.get(name, "other")] = out.get(cat.get(name, "other"), 0.0) + n
    return out
