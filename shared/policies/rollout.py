"""Software rollouts in waves: the plan and the regression decision (pure).

A cluster's software (node image, GPU driver, node agent) changes node by node: each node of a
wave is taken out of service, reimaged with the new version and passes the deep-check gate
before it returns. ``plan_waves`` orders the nodes (idle ones first, then busy ones by the cost
of moving their job, cheapest first), puts ``canary`` nodes in a wave of their own and sizes
every later wave within the blast-radius guard's budget per partition, so a rollout never takes
out more nodes than the repair guard would. ``judge`` decides, from the updated nodes' health,
whether the new version regressed: any updated node failing its gate, or the updated nodes
faulting clearly more often than the rest of the fleet over the same time. A regression pauses
the rollout and rolls every updated node back to the version it had.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.domain.errors import ValidationError

VERSION_KEYS = ("nodeImage", "driver", "agent")
ROLLOUTS = "rollouts"  # the collection of rollout records (services.repair.rollout)


class RolloutState(enum.StrEnum):
    RUNNING = "RUNNING"
    ROLLING_BACK = "ROLLING_BACK"  # paused by a regression; updated nodes go back
    ROLLED_BACK = "ROLLED_BACK"
    SUCCEEDED = "SUCCEEDED"


ACTIVE = frozenset({RolloutState.RUNNING, RolloutState.ROLLING_BACK})


def parse_tolerance(raw: object) -> float:
    """``gateTolerance``: a share of the updated nodes, from 0 (any failed gate regresses)
    to 0.5."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw <= 0.5:
        raise ValidationError("gateTolerance", "must be a number from 0 to 0.5")
    return float(raw)


def parse_version(raw: object) -> dict[str, str]:
    """A version as the API takes it: some of nodeImage, driver, agent, each a non-empty
    string; at least one."""
    if not isinstance(raw, Mapping) or not raw:
        raise ValidationError("version", f"must name at least one of {', '.join(VERSION_KEYS)}")
    out: dict[str, str] = {}
    for key, value in raw.items():
        if key not in VERSION_KEYS:
            raise ValidationError(f"version.{key}", f"unknown; one of {', '.join(VERSION_KEYS)}")
        if not isinstance(value, str) or not value.strip() or len(value) > 256:
            raise ValidationError(f"version.{key}", "must be a non-empty string (<= 256)")
        out[key] = value.strip()
    return out


def merged(current: Mapping[str, str], change: Mapping[str, str]) -> dict[str, str]:
    """The version a node has after ``change``: what it names replaces, the rest stays."""
    return {**current, **change}


@dataclass(frozen=True)
class Candidate:
    """A node a rollout may update: ``move_cost_s`` is the goodput its job loses when moved
    off by its cheapest recovery mode (0 for an idle node)."""

    node_id: str
    partition: str
    busy: bool = False
    move_cost_s: float = 0.0


@dataclass(frozen=True)
class WavePlan:
    waves: tuple[tuple[str, ...], ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for wave in self.waves for n in wave)


def plan_waves(candidates: Sequence[Candidate], budget: Mapping[str, int], wave_size: int,
               canary: int) -> WavePlan:
    """Idle nodes first, then busy ones by their move cost; ``canary`` nodes first in a wave
    of their own, then waves of at most ``wave_size`` with at most ``budget[partition]``
    nodes of each partition (the guard's out-of-service allowance, at least one)."""
    if wave_size < 1:
        raise ValidationError("waveSize", "must be at least 1")
    if canary < 0:
        raise ValidationError("canary", "must be 0 or more")
    order = sorted(candidates, key=lambda c: (c.busy, c.move_cost_s, c.node_id))
    waves: list[tuple[str, ...]] = []
    if canary and order:
        first = _fill(order, budget, canary)
        waves.append(tuple(c.node_id for c in first))
        order = [c for c in order if c not in first]
    while order:
        wave = _fill(order, budget, wave_size)
        waves.append(tuple(c.node_id for c in wave))
        order = [c for c in order if c not in wave]
    return WavePlan(tuple(waves))


def _fill(order: Sequence[Candidate], budget: Mapping[str, int], size: int
          ) -> list[Candidate]:
    taken: list[Candidate] = []
    per: dict[str, int] = {}
    for cand in order:
        if len(taken) == size:
            break
        if per.get(cand.partition, 0) < max(1, budget.get(cand.partition, 1)):
            taken.append(cand)
            per[cand.partition] = per.get(cand.partition, 0) + 1
    return taken


@dataclass(frozen=True)
class RegressionConfig:
    # the updated nodes fault more than ``fault_rate_factor`` times the rest's rate...
    fault_rate_factor: float = 2.0
    # ...judged only once they have run this long in all (node-seconds): one early fault
    # on a canary is noise
    min_node_s: float = 3600.0
    # an updated node's faults count only with at least this many of them in all
    min_faults: int = 2
    # and only when so many faults at the fleet's rate would be this unlikely (one-sided
    # Poisson): a few faults over a few hundred node-hours are chance, not a version; low,
    # because the test is made again on every tick of a rollout that lasts days
    p_value: float = 0.001
    # the share of the updated nodes that may fail the gate before it is a regression (0:
    # any one is): a fleet whose hardware fails often fails some gates whatever the version
    gate_tolerance: float = 0.0


@dataclass(frozen=True)
class FleetHealth:
    """The updated nodes against the rest of the fleet over the rollout's time so far."""

    gate_failed: tuple[str, ...] = ()  # updated nodes whose deep checks failed
    updated_nodes: int = 0  # nodes that have, or are getting, the new version
    updated_faults: int = 0
    updated_node_s: float = 0.0
    other_faults: int = 0
    other_node_s: float = 0.0


@dataclass(frozen=True)
class Verdict:
    regressed: bool
    reason: str = ""


def judge(health: FleetHealth, config: RegressionConfig = RegressionConfig()) -> Verdict:
    """Whether the new version regressed: a failed gate is one at once (more than
    ``gate_tolerance`` of the updated nodes, when tolerated); a fault rate above the fleet's
    counts once enough time and faults back it."""
    if len(health.gate_failed) > config.gate_tolerance * health.updated_nodes:
        return Verdict(True, f"updated node(s) failed the deep-check gate: "
                       f"{', '.join(sorted(health.gate_failed))}")
    if health.updated_node_s < config.min_node_s or health.updated_faults < config.min_faults:
        return Verdict(False)
    updated_rate = health.updated_faults / health.updated_node_s
    # the rest's rate, with one fault's worth of floor: a fleet with none is not a rate of 0
    other_rate = max(health.other_faults, 1) / max(health.other_node_s, config.min_node_s)
    chance = poisson_at_least(health.updated_faults, other_rate * health.updated_node_s)
    if updated_rate > config.fault_rate_factor * other_rate and chance < config.p_value:
        return Verdict(True, f"updated nodes fault {updated_rate * 3600:.3f}/node-hour, the "
                       f"fleet {other_rate * 3600:.3f}/node-hour (limit x"
                       f"{config.fault_rate_factor:g}; p={chance:.2g} at the fleet's rate)")
    return Verdict(False)


def poisson_at_least(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean)."""
    if k <= 0:
        return 1.0
    term = total = math.exp(-mean)
    for i in range(1, k):
        term *= mean / i
        total += term
    return max(0.0, 1.0 - total)


def wave_cost_s(plan: WavePlan, candidates: Sequence[Candidate]) -> float:
    """The goodput a plan costs in moved jobs: each busy node's move cost once."""
    cost = {c.node_id: c.move_cost_s for c in candidates}
    return sum(cost.get(n, 0.0) for n in plan.nodes)
