"""Score each incident of a benchmark run from its event log: the same code for live and twin.

Input: the event-log rows (dicts with ``type``, ``time``, ``data``, as the embedded app and the
twin keep them), the job, what the runner injected (:class:`Injected`: when, where, and the
step the program had reached if the runner could read it) and optional progress samples the
runner observed (``(time, attempt, step)``, e.g. a rank's progress heartbeat).

Per incident, from its injection to the next one (or the end of the log):

- **time to detect**: to the control plane's first reaction: a diagnosis of the faulty node,
  a drain, an interrupt, a recovery decision, a requeue, or the attempt's exit being
  recorded (:data:`REACTIONS`, the first one in the window);
- **time to recover**: to the first progress of an attempt started after the fault (its
  first step, or its first checkpoint past the step it resumed from, or a sample);
  training that never stopped (no new attempt) recovers at its first progress after the fault;
- **steps lost**: the newest step reached before the fault less the step the next attempt
  resumed from (``JobStarted.resume_step``, -1: from scratch); the newest step is the
  runner's reading when it has one, else the newest progress before the fault advanced by
  the job's measured pace (``estimated``), and at least the step of a checkpoint the
  faulted attempt saved after the fault (the program's checkpoint on SIGTERM);
- **mode**: the ``JobRecoveryChosen`` event in the window, else the job's recovery record
  (``decisions``: ``at``, ``mode``), else ``requeue`` when a new attempt started (today's
  only path), else ``none``.

The run's goodput is :func:`shared.goodput.job_accounting` over the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.goodput import infer_params, job_accounting
from shared.goodput.live import pace

T_STARTED = "mtc.job.started.v1"
T_CKPT = "mtc.job.checkpoint_saved.v1"
T_FIRST_STEP = "mtc.job.first_step.v1"
T_RECOVERY = "mtc.job.recovery_chosen.v1"  # the recovery policy's decision
# the control plane's reactions, by event type: (what it means, keyed on node or job)
REACTIONS: Mapping[str, tuple[str, str]] = {
    "mtc.node.diagnosed.v1": ("diagnosis", "node"),
    "mtc.node.draining.v1": ("drain", "job"),
    "mtc.job.interrupt_requested.v1": ("interrupt", "job"),
    T_RECOVERY: ("recovery decision", "job"),
    "mtc.job.requeued.v1": ("requeue", "job"),
    "mtc.job.workers_exited.v1": ("exit recorded", "job"),
}
Sample = tuple[float, int, int]  # (time, attempt, step)


@dataclass(frozen=True)
class Injected:
    """One fault as the runner played it."""

    index: int
    kind: str
    at: float  # epoch seconds (the twin: its simulated epoch)
    node_id: str
    rank: int | None = None
    step_at_fault: int | None = None  # the newest step the program reached, when known
    step_estimated: bool = False  # the runner estimated it (no progress heartbeat to read)


@dataclass(frozen=True)
class IncidentScore:
    index: int
    kind: str
    node_id: str
    at: float
    detected_s: float | None
    detected_by: str
    recovered_s: float | None
    stopped: bool  # a new attempt was needed (training stopped)
    step_at_fault: int | None
    step_estimated: bool
    resume_step: int | None
    steps_lost: int | None
    mode: str
    expected_lost_s: Any = None  # the policy's expectation, when it recorded one


@dataclass(frozen=True)
class RunScore:
    label: str  # "chosen" or "requeue" (a pinned mode)
    target: str  # "embedded" | "twin" | an API URL
    job_id: str
    incidents: tuple[IncidentScore, ...]
    goodput: dict[str, Any] = field(default_factory=dict)
    # faults the target could not play: {"index", "kind", "reason"} each
    skipped: tuple[Mapping[str, Any], ...] = ()
    # what the live control plane measured and weighed (restore per tier, where the save on
    # SIGTERM went, the tier heartbeat's cadence): the twin's inputs (simulator.bench_costs)
    costs: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "target": self.target, "job_id": self.job_id,
                "incidents": [asdict(i) for i in self.incidents], "goodput": self.goodput,
                "skipped": [dict(s) for s in self.skipped], "costs": dict(self.costs)}


def _mine(row: Mapping[str, Any], job_id: str) -> bool:
    return bool(row["data"].get("job_id") == job_id)


def progress_samples(rows: Iterable[Mapping[str, Any]], job_id: str,
                     extra: Iterable[Sample] = (), *, tier_events: bool = True) -> list[Sample]:
    """Every sign of the job's progress: checkpoints (memory and peer saves too, unless
    ``tier_events`` is false), first steps, the runner's samples."""
    out = list(extra)
    for r in rows:
        if not _mine(r, job_id):
            continue
        d = r["data"]
        if r["type"] == T_CKPT and (tier_events or d.get("tier", "durable") == "durable"):
            out.append((float(d.get("saved_at", r["time"])), int(d["attempt"]), int(d["step"])))
        elif r["type"] == T_FIRST_STEP:  # the program's own time of it, where it said
            at = float(r["time"])
            out.append((min(at, float(d.get("at") or at)), int(d["attempt"]), int(d["step"])))
    return sorted(out)


def score_incidents(rows: Sequence[Mapping[str, Any]], job_id: str,
                    injected: Sequence[Injected], *, samples: Iterable[Sample] = (),
                    decisions: Sequence[Mapping[str, Any]] = (),
                    resumes: Mapping[int, int] | None = None, tier_events: bool = True,
                    end: float | None = None) -> tuple[IncidentScore, ...]:
    """``resumes``: the step each attempt really resumed from, by attempt, where the runner
    read it (the program's log: a restore from a memory or peer tier is newer than the
    durable checkpoint ``JobStarted.resume_step`` names). ``tier_events`` false: memory and
    peer saves are no progress sign (a runner that reads the chief's own heartbeat, where
    ranks do not move together)."""
    rows = sorted(rows, key=lambda r: float(r["time"]))
    progress = progress_samples(rows, job_id, samples, tier_events=tier_events)
    read = resumes or {}
    starts = [(float(r["time"]), int(r["data"]["attempt"]),
               read.get(int(r["data"]["attempt"]), int(r["data"].get("resume_step", -1))))
              for r in rows if r["type"] == T_STARTED and _mine(r, job_id)]
    step_s = pace([r for r in rows if r["data"].get("tier", "durable") == "durable"], job_id)
    last = end if end is not None else (float(rows[-1]["time"]) if rows else 0.0)
    order = sorted(injected, key=lambda i: i.at)
    out = []
    for n, inc in enumerate(order):
        until = order[n + 1].at if n + 1 < len(order) else max(last, inc.at)
        out.append(_score(inc, until, rows, job_id, progress, starts, step_s, decisions))
    return tuple(out)


def _score(inc: Injected, until: float, rows: Sequence[Mapping[str, Any]], job_id: str,
           progress: list[Sample], starts: list[tuple[float, int, int]], step_s: float | None,
           decisions: Sequence[Mapping[str, Any]]) -> IncidentScore:
    window = [r for r in rows if inc.at <= float(r["time"]) <= until]
    detected_s, detected_by = None, ""
    for r in window:
        what = REACTIONS.get(r["type"])
        if what is None:
            continue
        d = r["data"]
        if what[1] == "node" and (d.get("node_id") != inc.node_id
                                  or d.get("action", "none") == "none"):
            continue
        if what[1] == "job" and d.get("job_id") != job_id:
            continue
        detected_s, detected_by = float(r["time"]) - inc.at, what[0]
        break
    new = next(((t, a, s) for t, a, s in starts if inc.at < t <= until), None)
    running = max((a for t, a, _ in starts if t <= inc.at), default=0)
    recovered_s = None
    if new is not None:
        resume = new[2]
        first = next((t for t, a, s in progress
                      if t > new[0] and t <= until and a >= new[1] and s > resume), None)
    else:
        resume = None
        first = next((t for t, a, _ in progress if inc.at < t <= until and a >= running), None)
    if first is not None:
        recovered_s = first - inc.at
    reached, estimated = _reached(inc, progress, running, step_s)
    # a checkpoint the faulted attempt saved after the fault (on SIGTERM) proves its step
    saved_after = max((s for t, a, s in progress if inc.at < t <= until and a == running),
                      default=None)
    if saved_after is not None and (reached is None or saved_after > reached):
        reached = saved_after
    lost = None
    if reached is not None and resume is not None:
        lost = max(0, reached - max(resume, 0))
    elif reached is not None and new is None and first is not None:
        lost = 0  # training never stopped
    mode, expected = _mode(inc.at, until, window, job_id, decisions, new is not None)
    return IncidentScore(inc.index, inc.kind, inc.node_id, inc.at, detected_s, detected_by,
                         recovered_s, new is not None, reached, estimated, resume, lost, mode,
                         expected)


def _reached(inc: Injected, progress: list[Sample], attempt: int,
             step_s: float | None) -> tuple[int | None, bool]:
    """The newest step the running attempt reached at the fault: read, or estimated from its
    newest progress and the measured pace."""
    if inc.step_at_fault is not None:
        return inc.step_at_fault, inc.step_estimated
    before = [(t, s) for t, a, s in progress if t <= inc.at and a == attempt]
    if not before:
        return None, True
    t, s = before[-1]
    if step_s is None or step_s <= 0:
        return s, True
    return s + math.floor((inc.at - t) / step_s), True


def _mode(at: float, until: float, window: Sequence[Mapping[str, Any]], job_id: str,
          decisions: Sequence[Mapping[str, Any]], restarted: bool) -> tuple[str, Any]:
    for r in window:
        if r["type"] == T_RECOVERY and r["data"].get("job_id") == job_id:
            return str(r["data"].get("mode", "?")), r["data"].get("expected_lost_s")
    for d in decisions:
        if at <= float(d.get("at", -math.inf)) <= until:
            return str(d.get("mode", "?")), d.get("expected_lost_s")
    return ("requeue" if restarted else "none"), None


def run_goodput(rows: Sequence[Mapping[str, Any]], job_id: str, nodes: int = 1,
                end: float | None = None) -> dict[str, Any]:
    """The run's goodput from the shared accounting (runtime goodput, ETTR, lost work)."""
    acct = job_accounting(rows, job_id, now=end, nodes=nodes)
    jg = acct.goodput
    p = infer_params([r for r in rows if _mine(r, job_id)], job_id, nodes)
    return {"step_time_s": round(p.step_time_s, 4), "startup_s": round(p.startup_s, 3),
            "save_s": round(p.checkpoint_save_s, 4), "wall_s": round(acct.wall_s, 3),
            "recovery_s": round(acct.recovery_s, 3),
            "lost_steps": acct.lost_steps, "restarts": acct.restarts,
            "runtime_goodput": round(acct.runtime_goodput, 4),
            "ettr": round(jg.ettr, 4) if jg is not None else 0.0,
            "by_category": {k: round(v, 3) for k, v in jg.by_category().items()} if jg else {}}


def score_run(rows: Sequence[Mapping[str, Any]], job_id: str, injected: Sequence[Injected], *,
              label: str, target: str, samples: Iterable[Sample] = (),
              decisions: Sequence[Mapping[str, Any]] = (), nodes: int = 1,
              resumes: Mapping[int, int] | None = None, tier_events: bool = True,
              end: float | None = None) -> RunScore:
    incidents = score_incidents(rows, job_id, injected, samples=samples, decisions=decisions,
                                resumes=resumes, tier_events=tier_events, end=end)
    return RunScore(label, target, job_id, incidents, run_goodput(rows, job_id, nodes, end))


def recover_ratio(base: RunScore, other: RunScore) -> list[dict[str, Any]]:
    """Per fault (matched by index), time to recover of ``other`` over ``base``'s."""
    theirs = {i.index: i for i in other.incidents}
    out = []
    for mine in base.incidents:
        o = theirs.get(mine.index)
        ratio = None
        if o is not None and mine.recovered_s and o.recovered_s is not None:
            ratio = o.recovered_s / mine.recovered_s
        out.append({"index": mine.index, "kind": mine.kind, "ratio": ratio})
    return out
