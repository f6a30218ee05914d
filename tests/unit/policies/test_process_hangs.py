"""Hangs seen from outside the program: the pure policy over folded process samples."""

from __future__ import annotations

import pytest

from shared.policies.process_hangs import (
    ProcessHangConfig,
    ProcSample,
    RankTrack,
    cpu_rate,
    judge,
    observe,
)

CONFIG = ProcessHangConfig(stopped_s=20.0, uninterruptible_s=60.0, quiet_s=600.0)


def track(rank: int, state: str = "S", since: float = 0.0, wrote_at: float = 0.0,
          cores: float = 0.0, span: float = 600.0, now: float = 1000.0) -> RankTrack:
    return RankTrack(rank, state, 100 + rank, since, 10, wrote_at,
                     ((now - span, 0.0), (now, cores * span)))


@pytest.mark.parametrize(("states", "now", "culprit", "words"), [
    # a stopped rank past the limit is named, its peers merely sleeping
    ({0: ("S", 0.0), 1: ("T", 970.0)}, 1000.0, 1, "stopped"),
    # stopped, but not for long enough yet
    ({0: ("S", 0.0), 1: ("T", 985.0)}, 1000.0, None, None),
    # stopped by a tracer (a debugger holding it) counts as stopped
    ({0: ("t", 900.0), 1: ("S", 0.0)}, 1000.0, 0, "tracer"),
    # a short uninterruptible sleep is ordinary I/O; a long one is wedged
    ({0: ("S", 0.0), 1: ("D", 950.0)}, 1000.0, None, None),
    ({0: ("S", 0.0), 1: ("D", 930.0)}, 1000.0, 1, "uninterruptible"),
    # two stopped: the one stopped first (the others may have stopped waiting on it)
    ({0: ("T", 960.0), 1: ("T", 950.0), 2: ("S", 0.0)}, 1000.0, 1, "stopped"),
    # a stopped rank outranks one in D
    ({0: ("D", 0.0), 1: ("T", 950.0)}, 1000.0, 1, "stopped"),
])
def test_a_rank_stuck_in_a_state_past_its_limit_is_the_culprit(
        states: dict[int, tuple[str, float]], now: float, culprit: int | None,
        words: str | None) -> None:
    tracks = [track(r, s, since, wrote_at=990.0) for r, (s, since) in states.items()]
    hang = judge(tracks, active_at=990.0, now=now, config=CONFIG)
    if words is None:
        assert hang is None
        return
    assert hang is not None and hang.culprit == culprit
    assert f"rank {culprit}" in hang.evidence and words in hang.evidence


@pytest.mark.parametrize(("cores", "culprit", "words"), [
    # gloo: the peers sleep in the kernel waiting; the culprit loops
    ({0: 0.0, 1: 0.98, 2: 0.01}, 1, "busy while its 2 peers idle"),
    # NCCL: the peers spin polling; the culprit sleeps
    ({0: 1.0, 1: 0.97, 2: 0.0}, 2, "idle while its 2 peers spin"),
    # everyone idle: nobody stands out, the program's own hang
    ({0: 0.0, 1: 0.0, 2: 0.01}, None, "every rank idle"),
    ({0: 0.0, 1: 0.0}, None, "every rank idle"),
    # everyone busy: perhaps a long computation that prints nothing; no verdict
    ({0: 1.0, 1: 1.0, 2: 1.0}, None, None),
    # two ranks: busy/idle cannot say which side waits
    ({0: 1.0, 1: 0.0}, None, None),
    # no single odd one among four
    ({0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0}, None, None),
])
def test_a_quiet_gang_names_the_rank_whose_cpu_differs_from_every_peer(
        cores: dict[int, float], culprit: int | None, words: str | None) -> None:
    tracks = [track(r, "S", wrote_at=300.0, cores=c) for r, c in cores.items()]
    hang = judge(tracks, active_at=300.0, now=1000.0, config=CONFIG)
    if words is None:
        assert hang is None
        return
    assert hang is not None and hang.culprit == culprit and words in hang.evidence
    assert hang.threshold_s == CONFIG.quiet_s and hang.silent_s == pytest.approx(700.0)


def test_output_or_a_checkpoint_within_the_quiet_limit_is_no_hang() -> None:
    idle = [track(r, "S", wrote_at=300.0) for r in range(3)]
    assert judge(idle, active_at=500.0, now=1000.0, config=CONFIG) is None  # a checkpoint
    wrote = [*idle[:2], track(2, "S", wrote_at=900.0)]
    assert judge(wrote, active_at=0.0, now=1000.0, config=CONFIG) is None  # output
    assert judge([], active_at=0.0, now=1000.0, config=CONFIG) is None


def test_observe_folds_samples_state_since_output_and_a_bounded_cpu_window() -> None:
    cfg = ProcessHangConfig(quiet_s=10.0)
    t = observe(None, ProcSample(0, "S", 7, 1.0, 100), 0.0, cfg)
    for at in range(2, 30, 2):
        t = observe(t, ProcSample(0, "S", 7, 1.0 + 0.5 * at, 100), float(at), cfg)
    assert t.state_since == 0.0 and t.wrote_at == 0.0
    assert t.cpu[0][0] <= 28.0 - 10.0 < t.cpu[1][0] and len(t.cpu) <= 7  # bounded to ~window
    assert cpu_rate(t) == pytest.approx(0.5)
    t = observe(t, ProcSample(0, "T", 9, 15.0, 120), 30.0, cfg)
    assert (t.state, t.pid, t.state_since, t.wrote_at) == ("T", 9, 30.0, 30.0)
    t = observe(t, ProcSample(0, "T", 9, 15.0, 120), 32.0, cfg)
    assert t.state_since == 30.0 and t.wrote_at == 30.0
