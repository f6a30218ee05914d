"""The analytic job model: what the simulated workers of a job do, without an event per step.

An attempt makes progress at ``speed / step_time`` steps per second (diurnal slowdown and
stragglers included), checkpoints on a fixed compute-time schedule, saves and exits 75 on
SIGTERM, and dies at once when a node under it fails (progress since the last checkpoint is
lost). Every second of an attempt is split into the job's truth ledger (:class:`JobTruth`), which
the event-log accounting is checked against.

:class:`JobModel` is one part of :class:`simulator.compute.SimCompute`; it reads the fleet and
the scenario that class holds, and emits ``JobCheckpointSaved`` / ``JobWorkersExited``.
"""

from __future__ import annotations

import math
from functools import reduce
from itertools import repeat
from operator import add

import simpy

from shared.adapters.compute.protocol import ExitCode, checkpoint_name
from shared.domain.events import Event, JobCheckpointSaved, JobFirstStep, JobWorkersExited
from simulator.bus import SimBus
from simulator.clock import EPOCH_S, call_later
from simulator.failures import Fault, diurnal_integral, diurnal_spans
from simulator.recovery_config import plan_for
from simulator.scenario_types import JobCfg, Scenario
from simulator.tiers import settle_tiered
from simulator.world import COMPUTE_SOURCE, Attempt, SimJob, SimNode

# the worker protocol's exit statuses, as plain ints on the hot path
EXIT_OK = int(ExitCode.OK)
EXIT_CRASH = int(ExitCode.FAILED)
EXIT_PREEMPTED = int(ExitCode.PREEMPTED)  # checkpoint saved on SIGTERM, run me again
EXIT_KILLED = int(ExitCode.KILLED)  # SIGKILL after the grace period
# with tiers, an entry is reported when it is made (the program's library), not at the exit:
# the save on SIGTERM is reported this long before the exit (both cross the bus)
REPORT_BEFORE_EXIT_S = 1.0


class JobModel:
    """The jobs' side of the simulated compute: attempts, checkpoints, exits."""

    env: simpy.Environment
    sc: Scenario
    bus: SimBus
    nodes: dict[str, SimNode]
    jobs: dict[str, SimJob]
    horizon: float

    def emit(self, event: Event, source: str = COMPUTE_SOURCE) -> None:
        self.bus.emit(event, source)

    def add_job(self, cfg: JobCfg) -> SimJob:
        job = SimJob(cfg, cfg.name)
        rec = self.sc.recovery
        if rec is not None and len(rec.tiers) > 1:  # (durable alone: the plain requeue)
            job.plan = plan_for(rec, cfg, self.sc.cluster.gpus_per_node)
        self.jobs[job.job_id] = job
        return job

    def _cycle(self, att: Attempt) -> tuple[float, float]:
        plan = att.job.plan
        if plan is not None:  # a snapshot (tier 1) or a synchronous durable save per cycle
            return plan.interval_s, plan.save_s
        cfg = att.job.cfg
        return cfg.checkpoint_interval_s, cfg.checkpoint_save_s

    @staticmethod
    def final_save_s(job: SimJob) -> float:
        """The save on SIGTERM or at the end of training."""
        return job.plan.final_save_s if job.plan is not None else job.cfg.checkpoint_save_s

    def _work(self, att: Attempt, t0: float, t1: float) -> tuple[float, float]:
        """Nominal work (seconds at full speed) done computing over [t0, t1], and the same
        with stragglers left out (diurnal slowdown only)."""
        if t1 <= t0:
            return 0.0, 0.0
        diurnal = self.sc.failures.diurnal
        factors = att.factors
        if len(factors) == 1 and factors[0][1] == 1.0:
            span = diurnal_integral(diurnal, t0, t1, EPOCH_S)
            return span, span
        total = plain = 0.0
        for i, (start, factor) in enumerate(factors):
            end = factors[i + 1][0] if i + 1 < len(factors) else math.inf
            a, b = max(t0, start), min(t1, end)
            if b > a:
                span = diurnal_integral(diurnal, a, b, EPOCH_S)
                total += factor * span
                plain += span
        return total, plain

    def _advance(self, att: Attempt, t: float) -> None:
        """Account the periodic checkpoints that completed by ``t``."""
        interval, save = self._cycle(att)
        cycle = interval + save
        n = int((t - att.ready + 1e-6) // cycle)
        if n <= att.counted:
            return
        truth = att.job.truth
        factors = att.factors
        if len(factors) == 1 and factors[0][1] == 1.0:  # at full speed: what the loop below
            # adds, span by span in the same order (``reduce``: the same sums, in C)
            spans = diurnal_spans(self.sc.failures.diurnal, att.ready, att.counted, n,
                                  interval, cycle, EPOCH_S)
            att.work_at_ckpt = reduce(add, spans, att.work_at_ckpt)
            att.plain_at_ckpt = reduce(add, spans, att.plain_at_ckpt)
            truth.save_s = reduce(add, repeat(save, n - att.counted), truth.save_s)
            att.counted = n
        while att.counted < n:
            c0 = att.ready + att.counted * cycle
            work, plain = self._work(att, c0, c0 + interval)
            att.work_at_ckpt += work
            att.plain_at_ckpt += plain
            att.counted += 1
            truth.save_s += save
        self._record_checkpoint(att, att.ready + n * cycle, att.work_at_ckpt)

    def _record_checkpoint(self, att: Attempt, at: float, work: float) -> None:
        job = att.job
        if job.plan is not None:  # which entry counts is known when progress stops (tiers)
            return
        step = att.base_step + int(work / job.cfg.step_time_s + 1e-9)
        if step > job.ckpt_step:
            job.ckpt_step = step
            job.ckpt_at = at

    def _settle(self, att: Attempt, t: float, *, saved: bool) -> None:
        """Progress stops at ``t``: split the attempt's time into the truth ledger."""
        if att.job.plan is not None:
            settle_tiered(self, att, t, saved=saved)
            return
        cfg = att.job.cfg
        truth = att.job.truth
        startup_end = att.start + cfg.startup_s + cfg.warmup_s
        truth.startup_s += max(0.0, min(t, startup_end) - att.start)
        truth.restore_s += max(0.0, min(t, att.ready) - startup_end)
        if t <= att.ready:
            return
        interval, save = self._cycle(att)
        cycle = interval + save
        self._advance(att, t)
        last_ckpt = att.ready + att.counted * cycle
        compute_kept = att.counted * interval
        work_kept = att.work_at_ckpt
        plain_kept = att.plain_at_ckpt
        tail = t - last_ckpt
        keep_tail = (saved or t >= self.horizon) and tail > 0
        if keep_tail:  # saved on SIGTERM, or still running at the end: the tail is kept
            seg = min(tail, interval)
            compute_kept += seg
            work, plain = self._work(att, last_ckpt, last_ckpt + seg)
            work_kept += work
            plain_kept += plain
            if saved:
                truth.save_s += save
                self._record_checkpoint(att, t + save, work_kept)
            tail = max(0.0, tail - seg)
        truth.wasted_s += max(0.0, tail)
        truth.kept_compute_s += compute_kept
        truth.kept_work_s += work_kept
        truth.slowdown_s["diurnal"] += max(0.0, compute_kept - plain_kept)
        truth.slowdown_s["straggler"] += max(0.0, plain_kept - work_kept)
        job = att.job
        job.steps_done = max(job.steps_done, att.base_step
                             + int(work_kept / cfg.step_time_s + 1e-9))

    def _save_on_sigterm(self, att: Attempt, now: float, grace_s: float) -> bool:
        """Schedule the graceful exit if the save fits the grace period (False: it does
        not, SIGKILL comes). A periodic save under way finishes first."""
        interval, save = self._cycle(att)
        cycle = interval + save
        into = (now - att.ready) % cycle
        final = self.final_save_s(att.job)
        if into >= interval:  # a periodic save is under way: let it finish
            done_at = now + (cycle - into)
            if done_at - now <= grace_s and att.job.plan is None:
                att.stopped_at = done_at
                call_later(self.env, done_at - now, self._graceful, att, done_at, False)
                return True
            if att.job.plan is not None and done_at - now + final <= grace_s:
                # the snapshot under way, then the save on SIGTERM (sent to the peer)
                att.stopped_at = done_at
                call_later(self.env, done_at - now + final, self._graceful, att, done_at, True)
                return True
        elif final <= grace_s:
            call_later(self.env, final, self._graceful, att, now, True)
            return True
        return False

    def _graceful(self, att: Attempt, stopped: float, save_now: bool) -> None:
        if att.exited or not att.alive:
            return
        self._settle(att, stopped, saved=save_now)
        att.alive = False
        if att.job.plan is not None:  # the library reports the save, then the process exits
            call_later(self.env, REPORT_BEFORE_EXIT_S, self._exit, att, EXIT_PREEMPTED,
                       "checkpoint saved on SIGTERM")
            return
        self._exit(att, EXIT_PREEMPTED, "checkpoint saved on SIGTERM")

    def _sigkill(self, att: Attempt) -> None:
        if att.exited:
            return
        if att.alive:
            att.alive = False
            self._settle(att, att.stopped_at or float(self.env.now), saved=False)
        self._exit(att, EXIT_KILLED, "killed after the grace period")

    def _kill(self, att: Attempt, t: float, cause: str, *, hang: bool) -> None:
        """A node under the attempt failed: progress stops now, workers exit later."""
        if not att.alive or att.exited:
            return
        att.alive = False
        att.cause = cause
        att.token += 1
        stopped = t if att.stopped_at is None else min(att.stopped_at, t)
        att.stopped_at = stopped
        self._settle(att, stopped, saved=False)
        cfg = att.job.cfg
        call_later(self.env, cfg.hang_exit_s if hang else cfg.crash_exit_s, self._crash_exit,
                   att)

    def _crash_exit(self, att: Attempt) -> None:
        if not att.exited:
            self._exit(att, EXIT_CRASH, f"cause={att.cause} crashed_at="
                                        f"{EPOCH_S + (att.stopped_at or 0.0):.3f}")

    def _launch_failed(self, att: Attempt, broken: list[tuple[str, Fault | None]]) -> None:
        if att.exited or not att.alive:
            return
        now = float(self.env.now)
        att.alive = False
        att.stopped_at = now
        self._settle(att, now, saved=False)
        for nid, fault in broken:
            if fault is not None and not fault.signal.empty:
                # the condition has been true since the fault, not since this launch: a
                # report with a new ``since`` reads as a second fault (``mtc sim fit``)
                self._report_fault(self.nodes[nid], fault, fault.at)
        self._exit(att, EXIT_CRASH, f"cause={att.cause} crashed_at={EPOCH_S + now:.3f} "
                                    f"launch failed on {broken[0][0]}")

    def _exit(self, att: Attempt, code: int, detail: str) -> None:
        if att.exited:
            return
        att.exited = True
        att.token += 1
        job = att.job
        # node.attempt keeps pointing here: every reader takes an exited attempt for none
        # (2,048 nodes a restart left alone; the next attempt on a node replaces it)
        if job.ckpt_step > job.emitted_step:
            self._emit_checkpoint(job, att.number)
        if code == EXIT_OK:
            job.finished = True
        self.emit(JobWorkersExited(job_id=job.job_id, attempt=att.number, exit_code=code,
                                   detail=detail))

    def _emit_checkpoint(self, job: SimJob, attempt: int) -> None:
        job.emitted_step = job.ckpt_step
        if job.plan is not None:  # each tier's newest entry, the one to restore from last
            entries = dict(job.tier_newest)
            entries[job.ckpt_tier] = (job.ckpt_step, job.ckpt_at)
            order = sorted(entries, key=lambda tier: (tier == job.ckpt_tier, entries[tier][0],
                                                      tier != "durable"))
            for tier in order:
                step, at = entries[tier]
                if step > job.tier_emitted.get(tier, -1):
                    job.tier_emitted[tier] = step
                    self._emit_tier(job, attempt, step, at, tier)
            return
        self.emit(JobCheckpointSaved(job_id=job.job_id, attempt=attempt, step=job.ckpt_step,
                                     path=f"sim://{job.job_id}/checkpoints/"
                                          f"{checkpoint_name(job.ckpt_step)}",
                                     saved_at=EPOCH_S + job.ckpt_at,
                                     save_s=job.cfg.checkpoint_save_s))

    def _emit_tier(self, job: SimJob, attempt: int, step: int, at: float, tier: str) -> None:
        plan = job.plan
        assert plan is not None
        save = plan.save_s if tier == "memory" or len(plan.tiers) == 1 \
            else plan.lag_s[tier]  # what the copy to that tier took
        self.emit(JobCheckpointSaved(job_id=job.job_id, attempt=attempt, step=step,
                                     path=f"sim://{job.job_id}/{tier}/{checkpoint_name(step)}",
                                     saved_at=EPOCH_S + at, save_s=save, tier=tier))

    def _first_step(self, att: Attempt) -> None:
        """The workers log their first step: the accounting measures startup up to it."""
        if att.exited or (att.stopped_at is not None and att.stopped_at < float(self.env.now)):
            return
        self.emit(JobFirstStep(job_id=att.job.job_id, attempt=att.number,
                               step=att.base_step + 1))

    def _periodic_checkpoint(self, att: Attempt, token: int) -> None:
        if token != att.token or not att.alive or att.exited:
            return
        now = float(self.env.now)
        self._advance(att, now)
        if att.job.ckpt_step > att.job.emitted_step:
            self._emit_checkpoint(att.job, att.number)
        interval, save = self._cycle(att)
        call_later(self.env, interval + save, self._periodic_checkpoint, att, token)

    def _plan_completion(self, att: Attempt) -> None:
        """Schedule the final save and exit 0 when the job's work is done."""
        job = att.job
        cfg = job.cfg
        assert cfg.work_s is not None
        remaining = cfg.work_s - att.base_step * cfg.step_time_s
        interval, save = self._cycle(att)
        cycle = interval + save
        now = float(self.env.now)
        self._advance(att, max(att.ready, now))
        done = att.work_at_ckpt
        k = att.counted
        while True:  # walk the compute segments from the last counted checkpoint on
            seg0 = att.ready + k * cycle
            seg1 = seg0 + interval
            w = self._work(att, seg0, seg1)[0]
            if done + w >= remaining:
                lo, hi = seg0, seg1
                for _ in range(60):
                    mid = (lo + hi) / 2
                    if done + self._work(att, seg0, mid)[0] >= remaining:
                        hi = mid
                    else:
                        lo = mid
                finish = max(hi, now)
                break
            done += w
            k += 1
            if k - att.counted > 10_000_000:  # pragma: no cover - a job at zero speed
                return
        call_later(self.env, finish - now, self._complete, att, att.token, finish)

    def _complete(self, att: Attempt, token: int, finish: float) -> None:
        if token != att.token or not att.alive or att.exited:
            return
        att.stopped_at = finish
        self._settle(att, finish, saved=True)
        att.alive = False
        call_later(self.env, self.final_save_s(att.job), self._exit, att, EXIT_OK,
                   "training finished")

    def _rearm_checkpoints(self, att: Attempt) -> None:
        interval, save = self._cycle(att)
        cycle = interval + save
        now = float(self.env.now)
        k = max(1, math.ceil((now - att.ready) / cycle))
        call_later(self.env, att.ready + k * cycle - now, self._periodic_checkpoint, att,
                   att.token)

    def finish(self) -> None:
        """At the horizon: account the attempts still running (their progress is not lost)."""
        now = float(self.env.now)
        for job in self.jobs.values():
            att = job.attempt
            if att is not None and att.alive and not att.exited and att.stopped_at is None:
                att.stopped_at = now
                self._settle(att, now, saved=False)

    def _report_fault(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        """A broken node that failed a launch reports its fault (the failure processes)."""
        raise NotImplementedError
