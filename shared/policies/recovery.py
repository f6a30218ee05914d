"""Which recovery an incident gets: the mode with the lowest expected lost time. Pure.

Each mode's cost is the time the job loses to it, from the job's own measured costs
(``JobCosts``: startup warm and cold, restore and progress lost per checkpoint tier) and the
capacity at hand (``Capacity``). A mode is *allowed* only where its path exists; the table
below says when, and what it costs:

============  ===========================================  ==================================
mode          allowed when                                 expected lost seconds
============  ===========================================  ==================================
in_place      the nodes stay usable (APP_RESTART) and      warm start + the best tier's
              the job has a memory (tier 1) entry          restore + progress since its entry
hot_swap      a node leaves, a spare is ready for each,    max(cold start + peer restore,
              and the job has a peer (tier 2) entry        warm start + memory restore)
                                                           + progress since the cut
scale_down    a node leaves, no spare is ready, the job    warm start + best surviving restore
              is elastic, replicas - 1 >= min_replicas     + progress since it
                                                           + (1/replicas) x min(spare eta,
                                                           repair eta)
requeue       always                                       cold start + durable restore
                                                           + progress since it + the wait
                                                           for capacity
============  ===========================================  ==================================

The cheapest allowed mode wins (ties: the order above, the least disruptive first); a
pinned mode wins when it is allowed, and when it is not the choice falls back and says so.
A job with no tiers and no elasticity always gets ``requeue``: the plain requeue.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    IN_PLACE = "in_place"
    HOT_SWAP = "hot_swap"
    SCALE_DOWN = "scale_down"
    REQUEUE = "requeue"


class Tier(StrEnum):
    MEMORY = "memory"  # tier 1: node-local tmpfs, lost with the node
    PEER = "peer"  # tier 2: a copy on a buddy node, survives one node's loss
    DURABLE = "durable"  # tier 3: baseOutputDirectory (Cloud Storage in production)


class IncidentKind(StrEnum):
    APP_RESTART = "app_restart"  # the node stays usable (RESTART_JOB classes, a hang)
    NODE_REPAIR = "node_repair"  # the node leaves service for a repair
    NODE_LOST = "node_lost"  # the node is gone with its memory


@dataclass(frozen=True)
class Incident:
    kind: IncidentKind
    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class TierCost:
    """``lost_s``: progress since the newest entry of this tier that survives the incident
    (``math.inf``: none)."""

    tier: Tier
    restore_s: float
    lost_s: float


@dataclass(frozen=True)
class JobCosts:
    step_s: float
    startup_cold_s: float
    startup_warm_s: float
    tiers: tuple[TierCost, ...]

    def tier(self, tier: Tier) -> TierCost | None:
        """The tier's cost, None when the job has no usable entry there."""
        found = [t for t in self.tiers if t.tier is tier and math.isfinite(t.lost_s)]
        return min(found, key=lambda t: t.lost_s) if found else None


@dataclass(frozen=True)
class Capacity:
    replicas: int
    min_replicas: int | None
    spares_ready: int
    spare_eta_s: float | None
    repair_eta_s: float


@dataclass(frozen=True)
class RecoveryDefaults:
    """What the policy assumes where a job has not measured it yet (``deps.config``): a
    job's own figures replace these as they come (checkpoint_resume's ``costs``).
    ``restore_s`` per tier; ``spare_eta_s`` None: no spare is on its way."""

    startup_cold_s: float = 120.0
    startup_warm_s: float = 20.0
    restore_memory_s: float = 5.0
    restore_peer_s: float = 30.0
    restore_durable_s: float = 120.0
    repair_eta_s: float = 1800.0
    spare_eta_s: float | None = None
    step_s: float = 1.0
    enabled: bool = True  # False: every incident is requeued (the plain requeue)

    def restore_s(self, tier: Tier) -> float:
        return {Tier.MEMORY: self.restore_memory_s, Tier.PEER: self.restore_peer_s,
                Tier.DURABLE: self.restore_durable_s}[tier]


@dataclass(frozen=True)
class Decision:
    mode: Mode
    expected_lost_s: tuple[tuple[Mode, float], ...]  # every allowed mode, cheapest first
    why: str

    def expected(self, mode: Mode | None = None) -> float | None:
        wanted = self.mode if mode is None else mode
        return next((s for m, s in self.expected_lost_s if m is wanted), None)


@dataclass(frozen=True)
class _Cost:
    """One mode's verdict: its expected lost seconds (None: not allowed) and the terms."""

    seconds: float | None
    terms: str


_ORDER = (Mode.IN_PLACE, Mode.HOT_SWAP, Mode.SCALE_DOWN, Mode.REQUEUE)
_VALUES = frozenset(m.value for m in Mode)
NODE_KINDS = (IncidentKind.NODE_REPAIR, IncidentKind.NODE_LOST)


def _s(x: float) -> str:
    return f"{x:.1f}s"


def _in_place(incident: Incident, costs: JobCosts, capacity: Capacity) -> _Cost:
    if incident.kind is not IncidentKind.APP_RESTART:
        return _Cost(None, "the node leaves service")
    if costs.tier(Tier.MEMORY) is None:
        return _Cost(None, "no memory-tier entry")
    best = _best(costs, tuple(Tier))  # every tier survives; the newest complete one is read
    total = costs.startup_warm_s + best.restore_s + best.lost_s
    return _Cost(total, f"warm start {_s(costs.startup_warm_s)} + {best.tier} restore "
                        f"{_s(best.restore_s)} + {_s(best.lost_s)} lost")


def _best(costs: JobCosts, tiers: tuple[Tier, ...]) -> TierCost:
    """The tier a restore reads: the least restore plus lost time (nearest first on a tie);
    callers make sure one exists."""
    usable = [t for t in (costs.tier(x) for x in tiers) if t is not None]
    return min(usable, key=lambda t: (t.restore_s + t.lost_s, _TIER_ORDER[t.tier]))


def _hot_swap(incident: Incident, costs: JobCosts, capacity: Capacity) -> _Cost:
    if incident.kind not in NODE_KINDS:
        return _Cost(None, "the nodes stay usable")
    if capacity.spares_ready < max(1, len(incident.node_ids)):
        return _Cost(None, f"{capacity.spares_ready} spare(s) ready for "
                           f"{max(1, len(incident.node_ids))} node(s)")
    peer = costs.tier(Tier.PEER)
    if peer is None:
        return _Cost(None, "no peer-tier entry for the fresh ranks")
    mem = costs.tier(Tier.MEMORY)
    others = mem if mem is not None and mem.restore_s <= peer.restore_s else peer
    fresh_s = costs.startup_cold_s + peer.restore_s
    warm_s = costs.startup_warm_s + others.restore_s
    # a consistent cut: the newest step every rank has; the fresh ranks have only the peer's
    lost = max(peer.lost_s, others.lost_s)
    return _Cost(max(fresh_s, warm_s) + lost,
                 f"max(cold start + peer restore {_s(fresh_s)}, warm start + {others.tier} "
                 f"restore {_s(warm_s)}) + {_s(lost)} lost")


def _scale_down(incident: Incident, costs: JobCosts, capacity: Capacity) -> _Cost:
    if incident.kind not in NODE_KINDS:
        return _Cost(None, "the nodes stay usable")
    if capacity.min_replicas is None:
        return _Cost(None, "the job is not elastic")
    if capacity.spares_ready >= max(1, len(incident.node_ids)):
        return _Cost(None, "a spare is ready (shrinking would only cost a regrow)")
    if capacity.replicas - 1 < capacity.min_replicas:
        return _Cost(None, f"{capacity.replicas} replicas, at least {capacity.min_replicas}")
    if all(costs.tier(x) is None for x in Tier):
        return _Cost(None, "no checkpoint to restart from")
    best = _best(costs, tuple(Tier))
    eta = capacity.repair_eta_s if capacity.spare_eta_s is None \
        else min(capacity.spare_eta_s, capacity.repair_eta_s)
    given_up = eta / max(1, capacity.replicas)
    total = costs.startup_warm_s + best.restore_s + best.lost_s + given_up
    return _Cost(total, f"warm start {_s(costs.startup_warm_s)} + {best.tier} restore "
                        f"{_s(best.restore_s)} + {_s(best.lost_s)} lost + 1/{capacity.replicas}"
                        f" of {_s(eta)} until capacity returns")


_TIER_ORDER = {Tier.MEMORY: 0, Tier.PEER: 1, Tier.DURABLE: 2}


def wait_for_capacity(incident: Incident, capacity: Capacity) -> float:
    """How long a requeued job waits for nodes: none when its nodes stay usable or a spare
    is ready for each lost one, otherwise until a spare or the repaired node comes."""
    if incident.kind is IncidentKind.APP_RESTART \
            or capacity.spares_ready >= max(1, len(incident.node_ids)):
        return 0.0
    if capacity.spare_eta_s is None:
        return capacity.repair_eta_s
    return min(capacity.spare_eta_s, capacity.repair_eta_s)


def _requeue(incident: Incident, costs: JobCosts, capacity: Capacity) -> _Cost:
    durable = costs.tier(Tier.DURABLE)
    restore_s, lost_s = (0.0, 0.0) if durable is None else (durable.restore_s, durable.lost_s)
    wait = wait_for_capacity(incident, capacity)
    what = "nothing durable: from the start" if durable is None else \
        f"durable restore {_s(restore_s)} + {_s(lost_s)} lost"
    return _Cost(costs.startup_cold_s + restore_s + lost_s + wait,
                 f"cold start {_s(costs.startup_cold_s)} + {what} + wait {_s(wait)}")


_RULES = {
    Mode.IN_PLACE: _in_place,
    Mode.HOT_SWAP: _hot_swap,
    Mode.SCALE_DOWN: _scale_down,
    Mode.REQUEUE: _requeue,
}


def costs_of(incident: Incident, costs: JobCosts, capacity: Capacity) -> dict[Mode, _Cost]:
    return {mode: _RULES[mode](incident, costs, capacity) for mode in _ORDER}


def choose(incident: Incident, costs: JobCosts, capacity: Capacity,
           pinned: Mode | None = None, barred: Mapping[Mode, str] | None = None) -> Decision:
    """The mode with the lowest expected lost time (a pin wins where allowed), and why.
    ``barred``: modes not allowed this time whatever they cost, with the reason (restarts
    without progress, ``shared.policies.escalation``); requeue is never barred."""
    verdicts = costs_of(incident, costs, capacity)
    for mode, reason in (barred or {}).items():
        if mode is not Mode.REQUEUE:
            verdicts[mode] = _Cost(None, reason)
    allowed = [(m, v.seconds) for m, v in verdicts.items()
               if v.seconds is not None and not math.isnan(v.seconds)]
    ranked = sorted(allowed, key=lambda mv: (mv[1], _ORDER.index(mv[0])))
    best = ranked[0][0]  # requeue is always allowed
    if all(math.isinf(s) for _, s in ranked):
        best = Mode.REQUEUE
    note = ""
    if pinned is not None:
        if pinned in dict(allowed):
            best, note = pinned, f"pinned to {pinned}; "
        else:
            note = f"pinned {pinned} not allowed ({verdicts[pinned].terms}), fell back; "
    chosen = verdicts[best]
    others = "; ".join(
        f"{m} {_s(s)}" if m is not best else "" for m, s in ranked if m is not best)
    refused = "; ".join(f"{m} not allowed: {v.terms}" for m, v in verdicts.items()
                        if v.seconds is None)
    why = f"{note}{best} {_s(chosen.seconds or 0.0)} = {chosen.terms}"
    if others:
        why += f"; vs {others}"
    if refused:
        why += f"; {refused}"
    return Decision(best, tuple((m, float(s)) for m, s in ranked), why)


MODE_LABEL = "mtc-recovery-mode"  # a job's or a cluster's pin
MIN_REPLICAS_LABEL = "mtc-min-replicas"  # elastic: the data-parallel pool may shrink to this


def label_errors(labels: dict[str, str]) -> list[tuple[str, str]]:
    """(field, message) for each recovery label a spec gets wrong (callers answer 400)."""
    out = []
    mode = labels.get(MODE_LABEL)
    if mode is not None and mode not in _VALUES:
        out.append((f"labels.{MODE_LABEL}", f"must be one of {', '.join(sorted(_VALUES))}"))
    low = labels.get(MIN_REPLICAS_LABEL)
    if low is not None and (not low.isdigit() or int(low) < 1):
        out.append((f"labels.{MIN_REPLICAS_LABEL}", "must be a whole number of replicas >= 1"))
    return out


def min_replicas(labels: dict[str, str]) -> int | None:
    """The elastic job's minimum replicas (None: not elastic, or not a number)."""
    low = labels.get(MIN_REPLICAS_LABEL, "")
    return int(low) if low.isdigit() and int(low) >= 1 else None


def pin_of(*labels: str | None) -> Mode | None:
    """The first label that names a mode (a job's pin before its cluster's); others ignored."""
    for label in labels:
        if label and label.strip().lower() in _VALUES:
            return Mode(label.strip().lower())
    return None
