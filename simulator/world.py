"""The simulated world's true state: nodes, jobs and their attempts (plain dataclasses), and the
sources the world's events come from.

The control plane never reads these: it sees only the events the simulated compute, agents and
operators emit. They are what really happened, against which the accounting is checked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from simulator.failures import Fault, NodeStream
from simulator.recovery_config import TierPlan
from simulator.scenario_types import JobCfg

COMPUTE_SOURCE = "//mtc/sim/compute"
AGENT_SOURCE = "//mtc/sim/agent"
OPERATOR_SOURCE = "//mtc/sim/operator"


@dataclass(slots=True)
class SimNode:
    node_id: str
    partition: str
    index: int
    multiplier: float
    up: bool = False
    deleted: bool = False
    fault: Fault | None = None
    straggle: float = 1.0  # speed ratio while straggling
    life_token: int = 0
    verify_token: int = 0
    verify_since: float = 0.0  # when the current post-repair checks began (epoch s)
    # the conditions the current checks report while they pass: the agent keeps a
    # condition's ``since`` while its status holds (node-problem-detector semantics,
    # ``shared.probes.agent.SinceTracker``), so every passing report of one round of checks
    # carries the same conditions, stamped when they were first seen passing
    passing: tuple[dict[str, Any], ...] = ()
    # the job whose latest attempt started here (None: none since it left one): a restart
    # reseats only the nodes that joined or left the gang (simulator.launches)
    seat: SimJob | None = None
    # an attempt still running here after its job started another without this node (or
    # on it while it was down): what ``attempt`` answers until the node is seated again
    pinned: Attempt | None = None
    replacement: bool = False
    stream: NodeStream | None = None  # its own failure randomness (simulator.streams.Streams)
    faults: int = 0  # faults so far: keys the detection-delay streams
    fault_reports: int = 0  # reports of the current fault so far (the same)
    repairs: int = 0  # repairs started so far
    repairing: bool = False  # a repair is in flight: the agent is not reporting
    reporting: Fault | None = None  # the fault the agent keeps reporting at its interval
    rack: str = ""  # its rack (the pool's topology; "" without one): a rack event takes it

    @property
    def attempt(self) -> Attempt | None:
        """The last attempt started here; an exited or dead one counts as none."""
        if self.pinned is not None:
            return self.pinned
        seat = self.seat
        return seat.attempt if seat is not None else None


@dataclass
class JobTruth:
    """What really happened to one job, second by second (the analytic model's ledger)."""

    kept_compute_s: float = 0.0  # compute wall time whose progress was kept
    kept_work_s: float = 0.0  # the same at nominal speed (steps x step time)
    wasted_s: float = 0.0  # compute since the last checkpoint, lost (partial saves included)
    save_s: float = 0.0  # blocking checkpoint saves that completed
    startup_s: float = 0.0
    restore_s: float = 0.0
    attempts: int = 0
    failed_launches: int = 0
    # with checkpoint tiers (scenario ``recovery``): restore seconds by the tier restored from
    restore_by_tier: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    interruptions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    slowdown_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass
class SimJob:
    cfg: JobCfg
    job_id: str
    ckpt_step: int = -1  # newest complete checkpoint (the program's own storage)
    ckpt_at: float = 0.0
    ckpt_tier: str = "durable"  # the tier the newest usable checkpoint is read from
    # with tiers: each tier's newest entry (step, time) and the newest step reported
    tier_newest: dict[str, tuple[int, float]] = field(default_factory=dict)
    tier_emitted: dict[str, int] = field(default_factory=dict)
    emitted_step: int = -1
    steps_done: int = 0
    finished: bool = False
    attempt: Attempt | None = None
    same_instant: tuple[float, int] = (-1.0, 0)  # (simulated t, starts at it): livelock guard
    truth: JobTruth = field(default_factory=JobTruth)
    plan: TierPlan | None = None  # its checkpoint tiers in numbers (None: durable alone)
    # nodes of its latest attempt that another job's attempt has taken since (their seat)
    lost: set[str] = field(default_factory=set)
    # the nodes of its latest attempt, kept up to date from restart to restart by the ranks
    # that changed (a 2,048-node gang keeps all but a few): what the attempt's ``members``
    # would be, without building a set of 2,048 and two differences per restart
    gang: set[str] = field(default_factory=set)
    # a software fault that may repeat after a restart until a code fix: (cause, first hit)
    bug: tuple[str, float] | None = None


@dataclass(slots=True)
class Attempt:
    job: SimJob
    number: int
    node_ids: tuple[str, ...]
    start: float
    ready: float
    base_step: int  # steps already in the checkpoint it resumed from (0 from scratch)
    # members it was not seated on (missing, deleted or down when it started)
    unseated: frozenset[str] = frozenset()
    alive: bool = True
    stopped_at: float | None = None  # progress stopped here (death, SIGTERM, exit)
    exited: bool = False
    token: int = 0
    factors: list[tuple[float, float]] = field(default_factory=list)  # (from t, straggle)
    counted: int = 0  # periodic checkpoints already accounted
    work_at_ckpt: float = 0.0  # nominal work in the counted checkpoints
    plain_at_ckpt: float = 0.0  # the same without straggler slowdown
    cause: str = ""
    _members: frozenset[str] | None = None
    # with checkpoint tiers: startup (warm or cold) and the tier restored from, the nodes
    # whose memory this attempt lost (their tier-1 entries), and its pace (a smaller gang)
    boot: float = 0.0
    restored_from: str = ""
    gone: set[str] | None = None
    scale: float = 1.0

    @property
    def members(self) -> frozenset[str]:
        """``node_ids`` as a set, built when first asked (its job's ``gang`` answers for the
        latest attempt)."""
        if self._members is None:
            self._members = frozenset(self.node_ids)
        return self._members


CHANGED_RANKS_SCAN = 16  # ranges this short are compared rank by rank


def changed_ranks(old: tuple[str, ...], new: tuple[str, ...], limit: int) -> list[int] | None:
    """The ranks at which two gangs of one size hold different nodes, in order; None when
    more than ``limit`` did. Halves of the range are compared as slices (in C, and a node
    kept is the same string object: compared by identity), and only a half that differs is
    split again: a few changes in 2,048 ranks cost a few passes over them, not 2,048 steps."""
    out: list[int] = []
    todo = [(0, len(old))]
    while todo:
        lo, hi = todo.pop()
        if old[lo:hi] == new[lo:hi]:
            continue
        if hi - lo <= CHANGED_RANKS_SCAN:
            out.extend(i for i in range(lo, hi) if old[i] != new[i])
            if len(out) > limit:
                return None
            continue
        mid = (lo + hi) // 2
        todo.append((mid, hi))
        todo.append((lo, mid))  # (popped first: the ranks come out in order)
    return out


def regang(job: SimJob, old: Attempt | None, att: Attempt, limit: int
           ) -> tuple[set[str], set[str]]:
    """Bring ``job.gang`` from ``old``'s nodes to ``att``'s; returns (joined, left). A restart
    that keeps its ranks changes a few of them: only those are looked at (more than
    ``limit``, or a gang of another size: the sets)."""
    changed: list[int] | None = None
    if old is not None:
        if old.node_ids is att.node_ids:
            changed = []
        elif len(old.node_ids) == len(att.node_ids):
            changed = changed_ranks(old.node_ids, att.node_ids, limit)
    if old is None or changed is None:  # the first start, a new size, or many changes
        gang = set(att.node_ids)
        before = job.gang if old is not None else set()
        job.gang = gang
        return gang - before, before - gang
    # the ranks kept hold the same nodes, so a node that moved rank is in both of these
    was = {old.node_ids[i] for i in changed}
    now = {att.node_ids[i] for i in changed}
    joined, left = now - was, was - now
    job.gang -= left
    job.gang |= joined
    return joined, left
