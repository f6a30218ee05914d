"""Fair share across teams: which waiting jobs may be placed, which running jobs are preempted
to give borrowed capacity back, and why each other job waits. Pure and deterministic.

Modelled on Kueue's ClusterQueue and cohort. Every team's queue holds, per partition, a
nominal quota in nodes and an optional borrowing limit; the teams of one partition form its
cohort.

- A team may use its nominal quota, and borrow beyond it what the partition has idle (other
  teams' unused quota, and nodes no team was given), up to its borrowing limit (none: no
  limit). A job that would take its team past nominal + borrowing limit waits.
- Jobs are considered in rank order: first every job that stays within its team's nominal
  quota, then the borrowing ones; inside each, priority (higher first), then submission
  (older first), then job id. A job's position is its place among its team's waiting jobs
  on its partition in priority, submission and id order.
- A job within its team's nominal quota that finds the partition full reclaims: running jobs
  of teams that borrow (use more than their nominal quota) are preempted, lowest priority
  first, then the newest first, each only while its team still borrows, until the job fits.
  A team at or under its nominal quota is never preempted; a job that no set of borrowers'
  jobs would make room for preempts nothing (a preemption that cannot help is only lost
  work), and a victim the others make room without is spared (Kueue's minimal
  preemptions). The reclaiming job waits until the preempted jobs have given their nodes
  back.
- A job in no configured queue is in the default queue (``DEFAULT_TEAM``), whose quota is
  zero unless configured: it only borrows.

Admission is about quota; placement (``shared.policies.scheduling``) still decides which
idle nodes fit. A job that ``decide`` admits may still wait there for fitting nodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from shared.domain.queues import DEFAULT_TEAM

__all__ = [
    "DEFAULT_TEAM",
    "PREEMPTION",
    "Decision",
    "QueuedJob",
    "Quota",
    "RunningJob",
    "Wait",
    "decide",
]

PREEMPTION = "preemption"  # an interrupt reason's prefix: the goodput cause of the lost time
RECLAIMING = "reclaiming quota"


@dataclass(frozen=True)
class Quota:
    team: str
    partition: str
    nominal: int  # nodes the team is guaranteed on the partition
    borrowing_limit: int | None = None  # nodes it may borrow beyond nominal (None: no limit)

    def __post_init__(self) -> None:
        if self.nominal < 0:
            raise ValueError(f"nominal quota must not be negative, got {self.nominal}")
        if self.borrowing_limit is not None and self.borrowing_limit < 0:
            raise ValueError(f"borrowing limit must not be negative, got {self.borrowing_limit}")


@dataclass(frozen=True)
class RunningJob:
    """A job holding nodes on the partition (running, or told to stop and not yet gone)."""

    job_id: str
    team: str
    partition: str
    nodes: int
    priority: int
    started_at: float
    stopping: bool = False  # already asked to stop: its nodes come back without asking again


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    team: str
    partition: str
    nodes: int  # nodes it asks for (the holes when it still holds some)
    priority: int
    submitted_at: float
    held: int = 0  # nodes it still holds (counted in its team's usage)

    def rank_key(self) -> tuple[int, float, str]:
        return (-self.priority, self.submitted_at, self.job_id)


@dataclass(frozen=True)
class Wait:
    position: int  # 1-based place in its team's queue on its partition
    reason: str  # "" when admitted (placement may still find no fitting nodes)


@dataclass(frozen=True)
class Decision:
    admitted: tuple[str, ...]  # the waiting jobs placement may place, in rank order
    preempt: tuple[tuple[str, str], ...]  # (running job id, reason), to stop and requeue
    waits: dict[str, Wait]  # every queued job's queue position and why it waits


def decide(quotas: Sequence[Quota], capacity: dict[str, int], running: Sequence[RunningJob],
           queued: Sequence[QueuedJob], now: float) -> Decision:
    """``capacity``: worker nodes per partition that take jobs (a partition not named has
    none). ``now`` is accepted for interface stability (aging); the decision does not use it."""
    del now
    table = {(q.team, q.partition): q for q in quotas}
    used: dict[tuple[str, str], int] = defaultdict(int)
    for r in running:
        used[r.team, r.partition] += r.nodes
    for w in queued:
        used[w.team, w.partition] += w.held
    total: dict[str, int] = defaultdict(int)
    for (_, partition), n in used.items():
        total[partition] += n
    positions = _positions(queued)
    # jobs already stopping first: a repeated pass picks the same ones, and asks no one else
    victims = sorted(running, key=lambda r: (not r.stopping, r.priority, -r.started_at,
                                             r.job_id))
    taken: set[str] = set()
    admitted: list[str] = []
    preempt: list[tuple[str, str]] = []
    waits: dict[str, Wait] = {}

    def nominal(team: str, partition: str) -> int:
        q = table.get((team, partition))
        return q.nominal if q else 0

    def within(w: QueuedJob) -> bool:
        return used[w.team, w.partition] + w.nodes <= nominal(w.team, w.partition)

    ordered = sorted(queued, key=lambda w: (not within(w), w.rank_key()))
    for w in ordered:
        key, part = (w.team, w.partition), w.partition
        free = capacity.get(part, 0) - total[part]
        q = table.get(key)
        limit = None if q is None or q.borrowing_limit is None else q.nominal + q.borrowing_limit
        reason = ""
        if limit is not None and used[key] + w.nodes > limit:
            reason = (f"over quota: team {w.team} uses {used[key]} of {nominal(*key)} nominal "
                      f"+ {limit - nominal(*key)} borrowable nodes on {part}; needs {w.nodes}")
        elif w.nodes <= free:
            admitted.append(w.job_id)
        elif used[key] + w.nodes <= nominal(*key):
            chosen = _reclaim(w, free, victims, taken, used, nominal)
            if chosen:
                for r in chosen:
                    taken.add(r.job_id)
                    used[r.team, r.partition] -= r.nodes
                    total[part] -= r.nodes
                    if not r.stopping:
                        preempt.append((r.job_id, f"{PREEMPTION}: team {w.team} reclaims its "
                                        f"nominal quota on {part} for job {w.job_id} (team "
                                        f"{r.team} was borrowing)"))
                reason = (f"{RECLAIMING}: waiting for {len(chosen)} preempted job(s) of "
                          f"borrowing teams to checkpoint and give back their nodes on {part}")
            else:
                reason = (f"partition {part} is full: waiting for jobs within their teams' "
                          f"quota to end ({w.nodes} nodes needed, {max(free, 0)} free)")
        else:
            reason = (f"waiting to borrow: partition {part} has {max(free, 0)} nodes free, "
                      f"{w.nodes} needed beyond team {w.team}'s nominal quota")
        if not reason or reason.startswith(RECLAIMING):
            # admitted, or reclaiming: the preempted jobs' nodes are kept for it, not lent
            used[key] += w.nodes
            total[part] += w.nodes
        waits[w.job_id] = Wait(positions[w.job_id], reason)
    passed = set(admitted)
    return Decision(tuple(j for j in _rank(queued) if j in passed), tuple(preempt), waits)


def _reclaim(w: QueuedJob, free: int, victims: Sequence[RunningJob], taken: set[str],
             used: dict[tuple[str, str], int],
             nominal: Callable[[str, str], int]) -> list[RunningJob]:
    """Borrowers' running jobs to stop so ``w`` fits, in preemption order; none when they
    cannot make room. A victim's team must still borrow when it is taken."""
    left: dict[str, int] = {}  # team -> nodes it uses beyond nominal, as victims are taken
    chosen: list[RunningJob] = []
    need = w.nodes - free
    for r in victims:
        if need <= 0:
            break
        if r.partition != w.partition or r.job_id in taken or r.team == w.team:
            continue
        over = left.get(r.team, used[r.team, r.partition] - nominal(r.team, r.partition))
        if over <= 0:
            continue
        left[r.team] = over - r.nodes
        chosen.append(r)
        need -= r.nodes
    if need > 0:
        return []
    # as Kueue does: give back every victim the others make room without, newest choice
    # first but the last (the one that made it fit), so no job is stopped for nothing
    for i in range(len(chosen) - 2, -1, -1):
        if need + chosen[i].nodes <= 0:
            need += chosen[i].nodes
            del chosen[i]
    return chosen


def _positions(queued: Iterable[QueuedJob]) -> dict[str, int]:
    counter: dict[tuple[str, str], int] = defaultdict(int)
    out: dict[str, int] = {}
    for w in _rank_jobs(queued):
        counter[w.team, w.partition] += 1
        out[w.job_id] = counter[w.team, w.partition]
    return out


def _rank_jobs(queued: Iterable[QueuedJob]) -> list[QueuedJob]:
    return sorted(queued, key=QueuedJob.rank_key)


def _rank(queued: Iterable[QueuedJob]) -> list[str]:
    return [w.job_id for w in _rank_jobs(queued)]
