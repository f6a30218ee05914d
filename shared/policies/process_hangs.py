"""Hangs seen from outside the program: each rank's processes as the node sees them (pure;
time is passed in).

A program that reports no per-rank progress (``shared.policies.hangs``) still leaves traces
on its node: the state of its processes, their CPU time, the output they write and the
checkpoints they save. From samples of those, folded per rank into a ``RankTrack``:

* **stuck state** (the clearest sign, table ``STATE_RULES``): a rank with a process stopped
  (``T``: SIGSTOP, a job-control stop; ``t``: held by a tracer) or in uninterruptible sleep
  (``D``: a wedged driver or file system call) for longer than that state's limit is the
  culprit. A stopped process can never enter the next collective, so its peers wait for it
  forever; a brief ``D`` is ordinary I/O, hence its longer limit.
* **quiet gang**: no rank wrote output and no checkpoint appeared for ``quiet_s``. CPU time
  alone cannot name a culprit: peers blocked in a gloo collective sleep in the kernel (flat
  CPU) while NCCL's peers spin (busy CPU), so a culprit looping in Python is "busy among
  idle peers" under gloo and one stuck in a sleep is "idle among busy peers" under NCCL.
  The rank whose CPU behaviour differs from every peer's (with at least ``odd_min_ranks``
  ranks, so "the others" are a majority) is named. Every rank idle is the program's own
  hang (no culprit, as in ``shared.policies.hangs``). Any other mix (every rank busy, or two
  ranks one busy) may be a long silent computation: no verdict here, the watchdog stays.

The verdict is the same ``Hang`` the per-rank progress policy gives, so the same condition,
triage row and program-fault rule act on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from shared.policies.hangs import Hang


@dataclass(frozen=True)
class ProcessHangConfig:
    stopped_s: float = 20.0  # a process stopped (T/t) longer than this: the rank hung
    uninterruptible_s: float = 60.0  # in D longer than this (brief D is ordinary I/O)
    quiet_s: float = 600.0  # no output and no checkpoint from any rank for this long
    busy_cores: float = 0.2  # CPU rate over the quiet window above which a rank is busy
    odd_min_ranks: int = 3  # fewer ranks: "differs from its peers" names no one


# state letter (proc(5) field 3) -> (what it means, the config field holding its limit)
STATE_RULES: tuple[tuple[str, str, str], ...] = (
    ("T", "stopped (SIGSTOP or job control)", "stopped_s"),
    ("t", "stopped by a tracer", "stopped_s"),
    ("D", "in uninterruptible sleep (D)", "uninterruptible_s"),
)


@dataclass(frozen=True)
class ProcSample:
    """One read of a rank's processes (the adapter's)."""

    rank: int
    state: str  # the most telling state among its processes (``STATE_RULES`` order first)
    pid: int  # the process in that state (the one whose stack is evidence)
    cpu_s: float  # user + system time of all its processes
    output_bytes: int  # the size of its output (log) so far


@dataclass(frozen=True)
class RankTrack:
    """A rank's samples folded: since when it is in its state, when it last wrote output,
    and its CPU time over the newest ``quiet_s`` (oldest first)."""

    rank: int
    state: str
    pid: int
    state_since: float
    output_bytes: int
    wrote_at: float
    cpu: tuple[tuple[float, float], ...]  # (at, cpu_s)


def observe(prev: RankTrack | None, sample: ProcSample, now: float,
            config: ProcessHangConfig) -> RankTrack:
    """``prev`` with ``sample`` taken at ``now``."""
    if prev is None:
        return RankTrack(sample.rank, sample.state, sample.pid, now, sample.output_bytes, now,
                         ((now, sample.cpu_s),))
    since = prev.state_since if sample.state == prev.state else now
    wrote = now if sample.output_bytes != prev.output_bytes else prev.wrote_at
    cpu = (*prev.cpu, (now, sample.cpu_s))
    # keep the newest sample at or before the window's start, so the rate spans the window
    start = next((i for i in range(len(cpu) - 1, -1, -1) if cpu[i][0] <= now - config.quiet_s),
                 0)
    return replace(prev, state=sample.state, pid=sample.pid, state_since=since,
                   output_bytes=sample.output_bytes, wrote_at=wrote, cpu=cpu[start:])


def cpu_rate(track: RankTrack) -> float:
    """Cores used over the samples kept (0 with fewer than two)."""
    (t0, c0), (t1, c1) = track.cpu[0], track.cpu[-1]
    return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


def judge(tracks: Sequence[RankTrack], active_at: float, now: float,
          config: ProcessHangConfig) -> Hang | None:
    """A hang with its culprit, or None. ``active_at``: the gang's newest sign of life the
    adapter sees besides output (the attempt's start, its newest checkpoint)."""
    if not tracks:
        return None
    stuck = _stuck(tracks, now, config)
    if stuck is not None:
        return stuck
    quiet_since = max(active_at, *(t.wrote_at for t in tracks))
    silent = now - quiet_since
    if silent <= config.quiet_s:
        return None
    verdict = _odd_one_out(tracks, config)
    if verdict is None:
        return None
    culprit, how = verdict
    return Hang(culprit, f"{how}; no rank wrote output and no checkpoint appeared for "
                         f"{silent:.1f} s (limit {config.quiet_s:.1f} s)", silent,
                config.quiet_s)


def _stuck(tracks: Sequence[RankTrack], now: float, config: ProcessHangConfig) -> Hang | None:
    for letter, meaning, limit_field in STATE_RULES:
        limit = float(getattr(config, limit_field))
        over = sorted((t for t in tracks if t.state == letter and now - t.state_since > limit),
                      key=lambda t: (t.state_since, t.rank))
        if over:
            pick = over[0]
            held = now - pick.state_since
            return Hang(pick.rank, f"rank {pick.rank} process {pick.pid} {meaning} for "
                                   f"{held:.1f} s (limit {limit:.1f} s); its peers wait for it",
                        held, limit)
    return None


def _odd_one_out(tracks: Sequence[RankTrack], config: ProcessHangConfig
                 ) -> tuple[int | None, str] | None:
    rates = {t.rank: cpu_rate(t) for t in tracks}
    busy = {r for r, c in rates.items() if c > config.busy_cores}
    shown = ", ".join(f"rank {r} {c:.2f}" for r, c in sorted(rates.items()))
    if len(tracks) >= config.odd_min_ranks:
        if len(busy) == 1:
            (rank,) = busy
            return rank, (f"rank {rank} busy while its {len(tracks) - 1} peers idle "
                          f"(CPU cores: {shown})")
        if len(busy) == len(tracks) - 1:
            (rank,) = set(rates) - busy
            return rank, (f"rank {rank} idle while its {len(tracks) - 1} peers spin "
                          f"(CPU cores: {shown})")
    if not busy:
        return None, f"every rank idle, none stands out (CPU cores: {shown})"
    return None  # busy ranks with no odd one out: perhaps computing without a word
