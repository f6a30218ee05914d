"""Every rank's heartbeat, read at a bounded rate and coalesced into per-job state; node
conditions out only when they change (never an event per step).

A Compute adapter calls ``RankWatch.scan`` for a running attempt at most every scan interval
(the same rate as the tier heartbeats). Only a program that reports per-rank progress
(``mtc_program.progress``: its heartbeat has ``progress_at``) is watched; for it the pure
policy (``shared.policies.hangs``) decides:

* a hang: ``HangInJob`` TRUE on the culprit's node, its evidence in the reason and details
  (once per attempt; triage turns it into the job's restart, in place or a hot swap, and
  ``checkpoint_resume`` fails a job that hangs again on another node as the program's fault);
  no culprit: the condition goes on rank 0's node with ``culprit: null`` (the program's);
* a straggler: ``SlowInJob`` TRUE on its node, with ``ratio_to_peers``; FALSE when it clears.

The conditions go out as ``NodeHealthReported`` from source ``job-progress`` (a report made
about the node from outside it: no heartbeat of its agent). ``HangInJob`` is set FALSE on the
nodes it was set on once a later attempt of the job progresses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.adapters.compute.protocol import progress_path
from shared.domain.events import NodeHealthReported
from shared.domain.health import JOB_PROGRESS_SOURCE, ConditionType
from shared.policies import hangs
from shared.policies.hangs import HangConfig, RankState, SlowConfig


def read_beats(checkpoint_dir: str | Path, attempt: int, world_size: int
               ) -> dict[int, dict[str, Any]]:
    """The ranks' heartbeats of ``attempt`` that carry per-rank progress (others left out)."""
    out: dict[int, dict[str, Any]] = {}
    for rank in range(world_size):
        try:
            beat = json.loads(progress_path(checkpoint_dir, rank).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(beat, dict) and beat.get("attempt") == attempt \
                and isinstance(beat.get("progress_at"), int | float):
            out[rank] = beat
    return out


def rank_state(rank: int, beat: Mapping[str, Any]) -> RankState:
    coll = beat.get("collective") if isinstance(beat.get("collective"), dict) else {}
    assert isinstance(coll, dict)
    return RankState(rank=rank, step=int(beat.get("step") or 0), seq=int(coll.get("seq") or 0),
                     inside=coll.get("state") == "entered", collective=str(coll.get("name", "")),
                     progress_at=float(beat["progress_at"]),
                     beat_at=float(beat.get("time") or 0.0),
                     beat_every_s=float(beat.get("beat_every_s") or 5.0))


def step_times(beats: Mapping[int, Mapping[str, Any]]) -> list[float]:
    """Every rank's recent step times (compute + wait): the job's own."""
    return [float(row[1]) + float(row[2]) for b in beats.values()
            for row in (b.get("steps") or ()) if isinstance(row, list) and len(row) == 3]


def compute_times(beats: Mapping[int, Mapping[str, Any]]) -> dict[int, list[tuple[int, float]]]:
    return {r: [(int(row[0]), float(row[1])) for row in (b.get("steps") or ())
                if isinstance(row, list) and len(row) == 3] for r, b in beats.items()}


@dataclass
class _Attempt:
    hung: bool = False
    slow: dict[int, bool] = field(default_factory=dict)
    progressed_at: float = 0.0


@dataclass
class RankWatch:
    """The adapter's coalesced per-job state (in memory: a restarted adapter starts afresh and
    at worst reports a condition again, which triage folds as unchanged)."""

    hang: HangConfig = field(default_factory=HangConfig)
    slow: SlowConfig = field(default_factory=SlowConfig)
    attempts: dict[tuple[str, int], _Attempt] = field(default_factory=dict)
    hung_on: dict[str, set[str]] = field(default_factory=dict)  # job -> nodes with HangInJob

    def scan(self, job_id: str, attempt: int, checkpoint_dir: str, node_of: Mapping[int, str],
             now: float) -> list[NodeHealthReported]:
        beats = read_beats(checkpoint_dir, attempt, len(node_of))
        if not beats:
            return []
        for key in [k for k in self.attempts if k[0] == job_id and k[1] < attempt]:
            del self.attempts[key]  # bounded: one attempt per job is remembered
        state = self.attempts.setdefault((job_id, attempt), _Attempt())
        out: list[NodeHealthReported] = []
        ranks = [rank_state(r, b) for r, b in sorted(beats.items())]
        newest = max(r.progress_at for r in ranks)
        if newest > state.progressed_at and any(r.step > 0 for r in ranks):
            state.progressed_at = newest
            out += self._clear_hangs(job_id, attempt, now)
        if not state.hung and len(beats) == len(node_of):
            found = hangs.judge(ranks, step_times(beats), now, self.hang)
            if found is not None:
                state.hung = True
                out.append(self._hang_report(job_id, attempt, found, node_of, ranks, now))
        out += self._stragglers(job_id, attempt, state, beats, node_of, now)
        return [fact for fact in out if fact.node_id]  # (a rank whose node is unknown)

    def _hang_report(self, job_id: str, attempt: int, found: hangs.Hang,
                     node_of: Mapping[int, str], ranks: list[RankState], now: float
                     ) -> NodeHealthReported:
        rank = found.culprit if found.culprit is not None else 0
        node = node_of[rank]
        self.hung_on.setdefault(job_id, set()).add(node)
        details = {"job_id": job_id, "attempt": attempt, "culprit": found.culprit,
                   "silent_s": round(found.silent_s, 3), "threshold_s": round(found.threshold_s, 3),
                   "ranks": {str(r.rank): [r.step, r.seq, r.inside] for r in ranks}}
        return _report(node, ConditionType.HANG_IN_JOB, True,
                       f"job {job_id} attempt {attempt}: {found.evidence}", details, now)

    def _clear_hangs(self, job_id: str, attempt: int, now: float) -> list[NodeHealthReported]:
        """A later attempt progresses: the hang conditions it left on nodes are lifted."""
        if any(k[0] == job_id and k[1] >= attempt and s.hung for k, s in self.attempts.items()):
            return []
        return [_report(node, ConditionType.HANG_IN_JOB, False,
                        f"job {job_id} progresses again (attempt {attempt})", {}, now)
                for node in sorted(self.hung_on.pop(job_id, set()))]

    def _stragglers(self, job_id: str, attempt: int, state: _Attempt,
                    beats: Mapping[int, Mapping[str, Any]], node_of: Mapping[int, str],
                    now: float) -> list[NodeHealthReported]:
        out = []
        for rank, score in hangs.scores(compute_times(beats), self.slow).items():
            was = state.slow.get(rank, False)
            now_slow = hangs.slow_in_job(was, score, self.slow)
            if now_slow == was:
                continue
            state.slow[rank] = now_slow
            verb = "slower than" if now_slow else "back in line with"
            out.append(_report(node_of[rank], ConditionType.SLOW_IN_JOB, now_slow,
                               f"job {job_id} rank {rank}: compute {score:.2f}x its peers' "
                               f"median, {verb} them", {"job_id": job_id, "attempt": attempt,
                               "rank": rank, "ratio_to_peers": round(score, 4)}, now))
        return out

    def forget(self, job_id: str, attempt: int) -> None:
        self.attempts.pop((job_id, attempt), None)


def _report(node_id: str, ctype: ConditionType, true: bool, reason: str,
            details: dict[str, Any], now: float) -> NodeHealthReported:
    cond = {"type": ctype.value, "status": "true" if true else "false", "reason": reason,
            "since": now, "details": details}
    return NodeHealthReported(node_id=node_id, observed_at=now, conditions=(cond,),
                              source=JOB_PROGRESS_SOURCE)
