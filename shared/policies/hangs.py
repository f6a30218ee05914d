"""Hangs with their culprit, and stragglers, from a job's own per-rank progress (pure; time
is passed in).

The ranks' heartbeats (``mtc_program.progress``) say per rank the step, the collective
last entered or left (with its sequence number), when the rank last progressed and when it
last wrote. From them:

* **hang**: no rank progressed for longer than ``factor x`` the job's own p99 step time,
  clamped to ``[floor_s, ceiling_s]`` (a job with too few steps timed gets the ceiling). The
  culprit is the rank that did not enter the collective the others wait in (its ``seq`` is
  behind the newest one a rank waits in), or, when every rank is in the same one, the rank
  whose heartbeat went stale inside it (its process stopped). No culprit (every rank alive
  and waiting in the same collective, or none reporting collectives) is a hang of the
  program itself.
* **straggler**: per rank, the median over recent steps of its compute time divided by the
  median of its peers' at the same step. A checkpoint or warm-up step slows every rank
  alike, so the ratio of that step stays near 1, and the median over steps ignores the odd
  outlier. A rank at ``1 + margin`` or more gets ``SlowInJob``; it loses it only below
  ``1 + clear_margin`` (hysteresis).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HANG_IN_JOB = "hang_in_job"  # the triage failure mode, and the reason prefix of its restart
PROGRAM_HANG = "program_hang"  # the reason a job fails with when it hangs on every node


@dataclass(frozen=True)
class HangConfig:
    factor: float = 3.0  # x the job's p99 step time
    floor_s: float = 10.0
    ceiling_s: float = 1800.0  # the old watchdog's 30 minutes: never later than it
    min_steps: int = 5  # steps timed before the job's own threshold is trusted
    stale_beats: float = 3.0  # a heartbeat older than this many intervals: the rank stopped


@dataclass(frozen=True)
class RankState:
    """One rank's heartbeat, as the adapter read it."""

    rank: int
    step: int
    seq: int  # collectives entered so far (0: none reported)
    inside: bool  # entered ``seq`` and not left it
    collective: str
    progress_at: float  # its last step end or collective entry/exit (unix s)
    beat_at: float  # when it last wrote its heartbeat
    beat_every_s: float


@dataclass(frozen=True)
class Hang:
    culprit: int | None  # the rank; None: the program itself (no rank stands out)
    evidence: str
    silent_s: float
    threshold_s: float


def p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def threshold(step_times: Sequence[float], config: HangConfig) -> float:
    """``factor x p99`` of the job's step times, clamped to [floor, ceiling]."""
    if len(step_times) < config.min_steps:
        return config.ceiling_s
    return min(config.ceiling_s, max(config.floor_s, config.factor * p99(step_times)))


def stale(rank: RankState, now: float, config: HangConfig) -> bool:
    return now - rank.beat_at > config.stale_beats * max(rank.beat_every_s, 0.05)


def judge(ranks: Sequence[RankState], step_times: Sequence[float], now: float,
          config: HangConfig) -> Hang | None:
    """A hang when no rank progressed past the threshold, with its culprit; None otherwise."""
    if not ranks:
        return None
    limit = threshold(step_times, config)
    silent = now - max(r.progress_at for r in ranks)
    if silent <= limit:
        return None
    culprit, evidence = _culprit(ranks, now, config)
    return Hang(culprit, f"{evidence}; no rank progressed for {silent:.1f} s "
                         f"(limit {limit:.1f} s)", silent, limit)


def _where(r: RankState) -> str:
    state = "inside" if r.inside else "after"
    return f"rank {r.rank} {state} {r.collective or 'collective'} #{r.seq} at step {r.step}"


def _culprit(ranks: Sequence[RankState], now: float, config: HangConfig
             ) -> tuple[int | None, str]:
    waiting = [r for r in ranks if r.inside]
    stopped = [r for r in ranks if stale(r, now, config)]
    if waiting:
        newest = max(r.seq for r in waiting)
        wait_in = next(r for r in waiting if r.seq == newest)
        behind = sorted((r for r in ranks if r.seq < newest),
                        key=lambda r: (r.seq, r.step, r.rank))
        if behind:
            pick = next((r for r in behind if r in stopped), behind[0])
            how = "stopped (heartbeat stale) " if pick in stopped else ""
            return pick.rank, (f"rank {pick.rank} {how}did not enter {wait_in.collective} "
                               f"#{newest} that {len(waiting)} rank(s) wait in ({_where(pick)})")
    if stopped:
        pick = min(stopped, key=lambda r: r.beat_at)
        return pick.rank, (f"rank {pick.rank} stopped ({_where(pick)}; heartbeat silent "
                           f"{now - pick.beat_at:.1f} s) while the others are alive")
    return None, "every rank alive and none behind the others: " + (
        f"all wait in {waiting[0].collective} #{waiting[0].seq}" if waiting
        else "no collective reported")


def program_fault(hung_nodes: Sequence[str], node: str) -> bool:
    """A job that hung before on another node hangs again: the program, not the nodes."""
    return any(earlier != node for earlier in hung_nodes if earlier)


# ---------------------------------------------------------------- stragglers


@dataclass(frozen=True)
class SlowConfig:
    # SlowInJob at compute >= 1.12 x the peers' median, kept until below 1.06 x (hysteresis).
    # Measured on a shared 2-core machine (tests/fixtures/rank_progress): ordinary noise
    # scored at most 1.10, a rank computing 30% longer 1.13-1.21 (time-slicing evens it out).
    margin: float = 0.12
    clear_margin: float = 0.06
    window: int = 32  # the newest steps every rank timed
    min_steps: int = 8  # fewer: no score (persistence: a median over at least this many)
    warmup_steps: int = 2  # an attempt's first steps (compile, caches) are not scored


def scores(timings: Mapping[int, Sequence[tuple[int, float]]], config: SlowConfig
           ) -> dict[int, float]:
    """Per rank: the median over the newest common steps of (its compute time / the median of
    its peers' at that step). Empty with fewer than two ranks or ``min_steps`` common steps."""
    if len(timings) < 2:
        return {}
    by_rank = {r: dict(rows) for r, rows in timings.items()}
    first = min((min(d) for d in by_rank.values() if d), default=0)
    common = set.intersection(*(set(d) for d in by_rank.values()))
    steps = sorted(s for s in common if s >= first + config.warmup_steps)[-config.window:]
    if len(steps) < config.min_steps:
        return {}
    out: dict[int, float] = {}
    for rank, mine in by_rank.items():
        ratios = []
        for s in steps:
            peers = statistics.median(d[s] for r, d in by_rank.items() if r != rank)
            if peers > 0:
                ratios.append(mine[s] / peers)
        if ratios:
            out[rank] = statistics.median(ratios)
    return out


def slow_in_job(was_slow: bool, score: float | None, config: SlowConfig) -> bool:
    """The condition with hysteresis: set at ``1 + margin``, cleared below ``1 + clear_margin``;
    no score keeps what was."""
    if score is None:
        return was_slow
    return score >= 1 + (config.clear_margin if was_slow else config.margin)
