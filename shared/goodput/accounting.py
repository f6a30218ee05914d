"""Goodput accounting from an event log: the same function serves the twin and the live system.

Input: event-log rows as the embedded app and the twin keep them, dicts with ``type`` (the
CloudEvent type), ``time`` (when the event was emitted, epoch seconds) and ``data`` (the event's
``to_dict()``); plus, per job, the few nominal figures the log cannot know (:class:`JobParams`:
step time, checkpoint save / restore / startup cost, checkpoint interval, MFU).

Output (:mod:`shared.goodput.totals`), per job and for the fleet, the three factors of
Google's ML Productivity Goodput (scheduling x runtime x program goodput; the Google Cloud blog
post of 2024-04-10 and the ml-goodput-measurement calculator,
https://github.com/AI-Hypercomputer/ml-goodput-measurement), each lost second in one badput
category *and* tied to the cause of the disruption that started it:

- scheduling goodput: time the job had its nodes / total time (``WAITING_FOR_CAPACITY``:
  submitted or requeued, not yet started: waiting for capacity, a spare, a repair);
- runtime goodput: kept training compute / time with nodes, net of
  ``INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION`` (from the fault to the requeue: detection, drain,
  exit), ``PROGRAM_STARTUP``, ``UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME``,
  ``UNPRODUCTIVE_CHECKPOINT_SAVE_TIME`` and ``WASTED_PROGRESS_FROM_DISRUPTION`` (computed since
  the last checkpoint, lost);
- program goodput: MFU x nominal speed share (``PROGRAM_SLOWDOWN``: kept compute that ran
  slower than the nominal step time: stragglers, heat).

ETTR (Meta's effective training time ratio, arXiv:2410.21680) is kept compute / total time.

How the log is read. An *attempt* runs from ``JobStarted`` to ``JobWorkersExited`` (or the end
of the window). Its startup (launch, restore, a slow first step) runs to its ``JobFirstStep``
less one nominal step, measured, not taken from the job's figures (those are used only for an
attempt that never logged its first step, split startup / restore by the restore figure). A
job that finishes (exit 0, no disruption) is not interrupted: its final save is the only cost.
Its progress stops at the first evidence of a disruption: the ``since`` of a TRUE condition
in a health report of one of its nodes (the kernel-log time of an XID, the last heartbeat),
an interrupt request or a drain of one of its nodes, a ``crashed_at=`` token in the exit
detail, else the exit itself. Kept progress ends at the newest ``JobCheckpointSaved`` of
the attempt (all of it when the attempt stopped gracefully or is still running at the end).
Checkpoint saves are counted from the events when every checkpoint is logged, otherwise from
the time-based schedule (``checkpoint_interval_s`` of compute, then a ``checkpoint_save_s``
save). The cause of a disruption is the ``cause`` detail of that condition when the reporter
gave one (the twin names its root cause there), else the failure mode that triage diagnosed,
else the prefix of the interrupt reason, else ``exit_code_N``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain import exits
from shared.goodput.fault_index import Drains, Reports
from shared.goodput.totals import (
    PROGRAM,
    SCHEDULING,
    Accounting,
    Badput,
    Disruption,
    FleetGoodput,
    JobGoodput,
    JobParams,
)

__all__ = [
    "PROGRAM",
    "SCHEDULING",
    "Accounting",
    "Badput",
    "Disruption",
    "FleetGoodput",
    "JobGoodput",
    "JobParams",
    "account",
]

CHECKPOINTING = "checkpointing"  # the cause of periodic saves: none, it is the insurance
INITIAL = "initial_start"
SLOW = "slow_program"

T_STARTED = "mtc.job.started.v1"
T_EXITED = "mtc.job.workers_exited.v1"
T_CKPT = "mtc.job.checkpoint_saved.v1"
T_REQUEUED = "mtc.job.requeued.v1"
T_SUBMITTED = "mtc.job.submitted.v1"
T_FINISHED = "mtc.job.finished.v1"
T_FIRST_STEP = "mtc.job.first_step.v1"
T_INTERRUPT = "mtc.job.interrupt_requested.v1"
T_DRAINING = "mtc.node.draining.v1"
T_HEALTH = "mtc.node.health_reported.v1"
T_DIAGNOSED = "mtc.node.diagnosed.v1"
T_PREFLIGHT = "mtc.job.preflight_checked.v1"
PREFLIGHT = "preflight"  # the cause of waiting time a preflight of the job's nodes took

_TOKEN = re.compile(r"(\w+)=(\S+)")


# ---------------------------------------------------------------- reading the log


def _after_preflights(start: float, windows: list[tuple[float, float]]) -> float:
    """An attempt's processes start after the preflights under way when it was logged
    (chained: a gang placed again is checked again); a start logged after them is kept."""
    for a, b in sorted(windows):
        if a <= start < b:
            start = b
    return start


@dataclass
class _Attempt:
    number: int
    start: float
    node_ids: tuple[str, ...]
    exit_at: float | None = None
    exit_code: int | None = None
    detail: str = ""
    _members: frozenset[str] | None = None

    @property
    def members(self) -> frozenset[str]:
        if self._members is None:
            self._members = frozenset(self.node_ids)
        return self._members


@dataclass
class _Evidence:
    at: float
    cause: str
    failure_mode: str
    graceful: bool


def _tokens(detail: str) -> dict[str, str]:
    return dict(_TOKEN.findall(detail or ""))


def _reason_cause(reason: str) -> str:
    return exits.interrupt_cause(reason)  # the watchdog's reasons give ``no_progress``


def account(rows: Iterable[Mapping[str, Any]], *, params: Mapping[str, JobParams],
            start: float, end: float, fleet_gpus: int | None = None,
            gpus_per_node: int = 8) -> Accounting:
    """Goodput of every job in ``params`` over [start, end] (epoch seconds)."""
    per_job: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    reports: list[tuple[float, str, str, str]] = []  # (fault time, node, cause, condition)
    diagnoses: dict[str, list[tuple[float, str]]] = defaultdict(list)
    drains: dict[str, list[tuple[float, str]]] = defaultdict(list)  # job -> (t, reason)
    for row in rows:
        type_ = row["type"]
        data = row["data"]
        if type_ == T_HEALTH:
            for cond in data.get("conditions", ()):
                if cond.get("status") != "true":
                    continue
                details = cond.get("details") or {}
                cause = str(details.get("cause") or "")
                since = cond.get("since", data.get("observed_at", row["time"]))
                reports.append((float(since), data["node_id"], cause, str(cond.get("type"))))
        elif type_ == T_DIAGNOSED:
            diagnoses[data["node_id"]].append((float(row["time"]), data["failure_mode"]))
        elif type_ == T_DRAINING:
            drains[data["job_id"]].append((float(row["time"]), data.get("reason", "")))
        elif "job_id" in data and data["job_id"] in params:
            per_job[data["job_id"]].append(row)
    indexed = Reports(reports)
    for found in diagnoses.values():
        found.sort()
    jobs = {job_id: _account_job(job_id, p, per_job.get(job_id, []), indexed, diagnoses,
                                 drains.get(job_id, []), start, end)
            for job_id, p in params.items()}
    gpus = fleet_gpus if fleet_gpus is not None else sum(
        p.nodes * gpus_per_node for p in params.values())
    fleet = FleetGoodput(gpus, end - start)
    for jg in jobs.values():
        width = jg.params.nodes * gpus_per_node
        fleet.job_gpu_s += jg.total_s * width
        fleet.productive_gpu_s += jg.productive_s * width
        fleet.nominal_gpu_s += jg.nominal_s * width
        fleet.effective_gpu_s += jg.nominal_s * width * jg.params.mfu
        for cat, v in jg.by_category().items():
            fleet.badput_gpu_s[cat] += v * width
    fleet.badput_gpu_s["IDLE_CAPACITY"] = fleet.idle_gpu_s
    return Accounting(jobs, fleet)


def _account_job(job_id: str, p: JobParams, rows: list[Mapping[str, Any]],
                 reports: Reports,
                 diagnoses: Mapping[str, list[tuple[float, str]]],
                 drains: list[tuple[float, str]], start: float, end: float) -> JobGoodput:
    jg = JobGoodput(job_id, p, start=start, end=end)
    rows = sorted(rows, key=lambda r: float(r["time"]))
    attempts: dict[int, _Attempt] = {}
    ckpts: list[tuple[float, int, int]] = []  # (saved_at, step, attempt)
    ckpt_tiers: dict[int, str] = {}  # step -> the tier it was logged in (restore_by_tier)
    requeues: list[float] = []
    interrupts: dict[int, list[tuple[float, str]]] = defaultdict(list)
    submitted: float | None = None
    finished: float | None = None
    first_steps: dict[int, float] = {}  # attempt -> when its first step had run
    preflights: list[tuple[float, float]] = []  # (started, finished): scheduling badput
    for row in rows:
        t = float(row["time"])
        data = row["data"]
        type_ = row["type"]
        if type_ == T_SUBMITTED and submitted is None:
            submitted = t
        elif type_ == T_STARTED:
            attempts.setdefault(int(data["attempt"]), _Attempt(
                int(data["attempt"]), t, tuple(data.get("node_ids", ()))))
        elif type_ == T_EXITED:
            att = attempts.get(int(data["attempt"]))
            if att is not None and att.exit_at is None:
                att.exit_at, att.exit_code, att.detail = t, int(data["exit_code"]), \
                    str(data.get("detail", ""))
        elif type_ == T_CKPT:
            if p.restore_by_tier:
                ckpt_tiers[int(data["step"])] = str(data.get("tier", "durable"))
            ckpts.append((float(data.get("saved_at", t)), int(data["step"]),
                          int(data["attempt"])))
        elif type_ == T_REQUEUED:
            requeues.append(t)
        elif type_ == T_INTERRUPT:
            interrupts[int(data["attempt"])].append((t, str(data.get("reason", ""))))
        elif type_ == T_FINISHED and finished is None:
            finished = t
        elif type_ == T_FIRST_STEP:  # when the program ran it, not when it was reported
            first_steps.setdefault(int(data["attempt"]), min(t, float(data.get("at") or t)))
        elif type_ == T_PREFLIGHT:
            preflights.append((float(data["started_at"]), float(data["finished_at"])))
    jg.start = max(start, submitted) if submitted is not None else start
    jg.end = min(end, finished) if finished is not None else end
    if jg.end <= jg.start:
        jg.end = jg.start
        return jg
    ckpts.sort()
    ckpt_times = [c[0] for c in ckpts]
    best_step = list(itertools.accumulate((c[1] for c in ckpts), max))  # newest by then
    if preflights:  # a start logged as the preflight began (the twin prices it): after it
        for att in attempts.values():
            att.start = _after_preflights(att.start, preflights)
    ordered = sorted(attempts.values(), key=lambda a: a.start)
    job_drains = Drains(drains)
    if len(reports.by_node) > 4 * p.nodes:  # one job of many: only its own nodes' reports
        reports = reports.of(set(itertools.chain.from_iterable(a.node_ids for a in ordered)))
    jg.attempts = len(ordered)
    add = jg.badput

    def segment(cat: Badput, cause: str, t0: float, t1: float) -> None:
        t0, t1 = max(t0, jg.start), min(t1, jg.end)
        if t1 <= t0:
            return
        checked = 0.0  # waiting that a preflight of the job's nodes took: its own cause
        if cat is Badput.WAITING_FOR_CAPACITY:
            checked = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in preflights)
            if checked > 0:
                add[(cat, PREFLIGHT)] += checked
        if t1 - t0 - checked > 0:
            add[(cat, cause)] += t1 - t0 - checked

    cause = INITIAL
    cursor = jg.start  # accounted up to here
    for i, att in enumerate(ordered):
        if att.start >= jg.end:
            break
        # before the attempt: recovery until the requeue, then waiting for nodes
        requeue = _first_in(requeues, cursor, att.start)
        if requeue is not None and cause != INITIAL:
            segment(Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, cause, cursor, requeue)
            segment(Badput.WAITING_FOR_CAPACITY, cause, requeue, att.start)
        elif cause == INITIAL:
            segment(Badput.WAITING_FOR_CAPACITY, cause, cursor, att.start)
        else:
            segment(Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, cause, cursor, att.start)
        stop = min(att.exit_at if att.exit_at is not None else math.inf, jg.end)
        nxt = ordered[i + 1].start if i + 1 < len(ordered) else math.inf
        stop = min(stop, nxt)
        # (the checkpoints are sorted by time: bisected, not scanned once per attempt)
        saved_by_start = bisect.bisect_right(ckpt_times, att.start)
        resumed = saved_by_start > 0
        resume_step = best_step[saved_by_start - 1] if saved_by_start else 0
        until = bisect.bisect_right(ckpt_times, stop + 1e-6, lo=saved_by_start)
        mine = [c for c in ckpts[saved_by_start:until] if c[2] == att.number]
        startup, restore = p.startup_s, (p.checkpoint_restore_s if resumed else 0.0)
        if resumed and p.restore_by_tier:
            restore = dict(p.restore_by_tier).get(ckpt_tiers.get(resume_step, ""), restore)
        first = first_steps.get(att.number)
        if first is not None:  # measured: start to the end of the first step, less its
            ready = max(att.start, first - p.step_time_s)  # nominal compute
            ready0 = max(att.start, ready - restore)
        else:  # no first step logged: from the first checkpoint (live), else nominal
            if p.measure_startup and mine:
                startup, restore = _measured_startup(p, att.start, mine[0], resume_step, restore)
            ready0 = att.start + startup
            ready = ready0 + restore
        ev = _evidence(att, p, reports, diagnoses, job_drains, interrupts.get(att.number, []),
                       stop, jg.end)
        halt = min(ev.at, stop) if ev is not None else stop
        if att.exit_code == 0 and mine:  # the final save is not training
            halt = min(halt, mine[-1][0] - p.checkpoint_save_s)
        still_running = att.exit_at is None and stop >= jg.end and ev is None
        segment(Badput.PROGRAM_STARTUP, cause, att.start, min(ready0, halt))
        segment(Badput.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME, cause, ready0, min(ready, halt))
        graceful = att.exit_code in exits.GRACEFUL and bool(mine) and (ev is None or ev.graceful)
        if halt > ready:
            cycle = p.checkpoint_interval_s + p.checkpoint_save_s
            if still_running or graceful:
                kept_end = halt
            else:
                before = [c for c in mine if c[0] <= halt + 1e-6]
                kept_end = before[-1][0] if before else ready
                kept_end = max(ready, min(kept_end, halt))
            if p.all_checkpoints:
                periodic = sum(1 for c in mine if ready < c[0] <= kept_end + 1e-6)
                if graceful and mine and mine[-1][0] > halt:
                    periodic = sum(1 for c in mine if ready < c[0] <= halt + 1e-6)
            else:
                periodic = int((kept_end - ready + 1e-6) // cycle)
            saves = periodic * p.checkpoint_save_s
            compute = max(0.0, kept_end - ready - saves)
            jg.productive_s += compute
            last_step = max((c[1] for c in mine), default=resume_step)
            if still_running:  # the compute after its newest logged checkpoint: nominal
                steps_nominal = (last_step - resume_step) * p.step_time_s
                logged = 0.0
                if mine:
                    n_logged = round((mine[-1][0] - ready) / cycle)
                    logged = max(0.0, mine[-1][0] - ready - n_logged * p.checkpoint_save_s)
                nominal = steps_nominal + max(0.0, compute - logged)
            else:
                nominal = (last_step - resume_step) * p.step_time_s
            nominal = min(nominal, compute)
            jg.nominal_s += nominal
            add[(Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, CHECKPOINTING)] += saves
            if compute - nominal > 0:
                add[(Badput.PROGRAM_SLOWDOWN, SLOW)] += compute - nominal
            segment(Badput.WASTED_PROGRESS_FROM_DISRUPTION, ev.cause if ev else "exit",
                    kept_end, halt)
        if still_running:
            cursor = jg.end
            break
        if att.exit_code == 0 and ev is None:  # training finished: no interruption
            cause = CHECKPOINTING  # (its final save, below, is the only cost)
        else:
            cause = ev.cause if ev is not None else _exit_cause(att)
            jg.disruptions.append(Disruption(halt, att.number, cause,
                                             ev.failure_mode if ev else "", graceful))
        if graceful and mine and mine[-1][0] > halt:  # the save on SIGTERM
            segment(Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, cause, halt, mine[-1][0])
            cursor = max(halt, min(mine[-1][0], stop))
        else:
            cursor = halt
        if att.exit_code == 0:
            cursor = max(cursor, stop)
            break
    if cursor < jg.end:  # the window ends while the job waits to run again
        requeue = _first_in(requeues, cursor, jg.end)
        if cause == INITIAL:
            segment(Badput.WAITING_FOR_CAPACITY, cause, cursor, jg.end)
        elif requeue is not None:
            segment(Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, cause, cursor, requeue)
            segment(Badput.WAITING_FOR_CAPACITY, cause, requeue, jg.end)
        else:
            segment(Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, cause, cursor, jg.end)
    accounted = jg.productive_s + jg.lost() - jg.lost(Badput.PROGRAM_SLOWDOWN)
    gap = jg.total_s - accounted
    if abs(gap) > 1e-6:
        add[(Badput.OTHER, "unaccounted")] += gap
    return jg


def _measured_startup(p: JobParams, started: float, first: tuple[float, int, int],
                      resume_step: int, restore: float) -> tuple[float, float]:
    """(startup, restore) of one attempt, measured: its first checkpoint came this long after
    the start, less the steps it holds at the nominal pace and the save. The restore keeps its
    nominal share of that overhead (the log cannot split them); the rest is startup, a slow
    first step included, as the public calculator counts it."""
    saved_at, step, _ = first
    overhead = saved_at - started - (step - resume_step) * p.step_time_s - p.checkpoint_save_s
    if overhead < 0:  # a pace faster than nominal: the nominal figures are the better guess
        return p.startup_s, restore
    restore = min(restore, overhead)
    return overhead - restore, restore


def _first_in(times: list[float], lo: float, hi: float) -> float | None:
    i = bisect.bisect_left(times, lo)
    return times[i] if i < len(times) and times[i] <= hi else None


def _exit_cause(att: _Attempt) -> str:
    tokens = _tokens(att.detail)
    if "cause" in tokens:
        return tokens["cause"]
    return f"exit_code_{att.exit_code}" if att.exit_code is not None else "unknown"


def _evidence(att: _Attempt, p: JobParams, reports: Reports,
              diagnoses: Mapping[str, list[tuple[float, str]]],
              drains: Drains, interrupts: list[tuple[float, str]],
              stop: float, end: float) -> _Evidence | None:
    """When the attempt's progress stopped, and why (None: it never was disrupted)."""
    horizon = min(stop, end)
    report: tuple[float, str, str] | None = None  # (fault time, cause, failure mode)
    first = reports.first(att, horizon, diagnoses)
    if first is not None:
        since, node_id, cause, ctype = first
        mode = _mode_after(diagnoses.get(node_id, []), since)
        report = (since, cause or mode or ctype, mode)
    signal: tuple[float, str] | None = None  # a drain or an interrupt request: SIGTERM
    for t, reason in interrupts:
        if att.start <= t <= horizon and (signal is None or t < signal[0]):
            signal = (t, reason)
    # the job's first drain in the window, from its drains in time order (bisected: a job
    # with 500 attempts and 400 drains looked at every drain for every attempt)
    i = bisect.bisect_left(drains.times, att.start)
    if i < len(drains.times) and drains.times[i] <= horizon \
            and (signal is None or drains.times[i] < signal[0]):
        signal = drains.by_time[i]
    tokens = _tokens(att.detail)
    graceful_exit = att.exit_code in exits.GRACEFUL
    if graceful_exit:
        if signal is None:
            return None if att.exit_code == 0 else _Evidence(
                att.exit_at or horizon, _exit_cause(att), "", True)
        cause = report[1] if report is not None and report[0] <= signal[0] \
            else _reason_cause(signal[1])
        mode = report[2] if report is not None else _reason_cause(signal[1])
        return _Evidence(signal[0], cause, mode, True)
    times: list[tuple[float, str, str]] = []
    if report is not None:
        times.append(report)
    if signal is not None:
        times.append((signal[0], _reason_cause(signal[1]), _reason_cause(signal[1])))
    if "crashed_at" in tokens:
        times.append((float(tokens["crashed_at"]), _exit_cause(att), ""))
    if not times:
        if att.exit_at is None or att.exit_at > end:
            return None
        return _Evidence(att.exit_at, _exit_cause(att), "", False)
    at, cause, mode = min(times)
    if report is None and "cause" in tokens:
        cause = tokens["cause"]
    return _Evidence(max(att.start, at), cause, mode, False)


def _mode_after(diagnoses: list[tuple[float, str]], since: float) -> str:
    for t, mode in diagnoses:
        if t >= since:
            return mode
    return ""
