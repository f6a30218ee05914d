"""The analytic job model: what the simulated workers of a job do, without an event per step.

An attempt makes progress at ``speed / step_time`` steps per second (diurnal slowdown and
stragglers included), checkpoints on a fixed compute-time schedule, saves and exits 75 on
SIGTERM, and dies at once when a node under it fails (progress since the last checkpoint is
lost). Every second of an attempt is split into the job's truth ledger (:class:`JobTruth`), which
the event-log accounting is checked against.

:class:`JobModel` holds the fleet, the tiers (a tiered job's stops) and the node agent (a
launch that fails on a broken node has it report the fault); it emits ``JobFirstStep``,
``JobCheckpointSaved`` and ``JobWorkersExited``.
"""

from __future__ import annotations

import math

from shared.adapters.compute.protocol import ExitCode, checkpoint_name
from shared.domain.events import JobCheckpointSaved, JobFirstStep, JobWorkersExited
from simulator.agent import Agent
from simulator.clock import EPOCH_S, call_later
from simulator.failures import Fault
from simulator.fleet import Fleet
from simulator.progress import advance, cycle_of, final_save_s, record_checkpoint, work
from simulator.recovery_config import plan_for
from simulator.scenario_types import JobCfg
from simulator.tiers import Tiers, recovery_draws
from simulator.world import Attempt, SimJob

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

    def __init__(self, fleet: Fleet, tiers: Tiers, agent: Agent) -> None:
        self.fleet = fleet
        self.tiers = tiers
        self.agent = agent
        self.diurnal = fleet.sc.failures.diurnal  # (the scenario is frozen)

    def add_job(self, cfg: JobCfg) -> SimJob:
        job = SimJob(cfg, cfg.name)
        sc = self.fleet.sc
        rec = sc.recovery
        if rec is not None and len(rec.tiers) > 1:  # (durable alone: no plan)
            job.plan = plan_for(rec, cfg, sc.cluster.gpus_per_node)
        self.fleet.jobs[job.job_id] = job
        return job

    # -- an attempt's life
    def begin(self, att: Attempt, broken: list[tuple[str, Fault | None]],
              startup: float) -> None:
        """The attempt is seated: it fails to launch on ``broken`` nodes, or runs (its first
        step, its checkpoints, its end when the job's work is done)."""
        env = self.fleet.env
        job = att.job
        cfg = job.cfg
        now = float(env.now)
        if broken:
            job.truth.failed_launches += 1
            fail_at = min(cfg.launch_fail_s, startup)
            att.cause = broken[0][1].cause.name if broken[0][1] is not None else "node_missing"
            call_later(env, fail_at, self._launch_failed, att, broken)
            return
        if cfg.work_s is not None:
            self.plan_completion(att)
        call_later(env, att.ready + cfg.step_time_s - now, self._first_step, att)
        if job.bug is not None:
            self._maybe_recur(att, now)
        if self.fleet.sc.checkpoint_events == "all":
            call_later(env, att.ready + cfg.checkpoint_interval_s + cfg.checkpoint_save_s
                       - now, self._periodic_checkpoint, att, att.token)

    def settle(self, att: Attempt, t: float, *, saved: bool) -> None:
        """Progress stops at ``t``: split the attempt's time into the truth ledger."""
        job = att.job
        if job.plan is not None:
            if self.tiers.settle(att, t, saved=saved) and job.ckpt_step > job.emitted_step \
                    and t < self.fleet.horizon:
                self._emit_checkpoint(job, att.number)  # reported as it is known
            return
        cfg = job.cfg
        truth = job.truth
        startup_end = att.start + cfg.startup_s + cfg.warmup_s
        truth.startup_s += max(0.0, min(t, startup_end) - att.start)
        truth.restore_s += max(0.0, min(t, att.ready) - startup_end)
        if t <= att.ready:
            return
        interval, save = cycle_of(att)
        cycle = interval + save
        diurnal = self.diurnal
        advance(diurnal, att, t)
        last_ckpt = att.ready + att.counted * cycle
        compute_kept = att.counted * interval
        work_kept = att.work_at_ckpt
        plain_kept = att.plain_at_ckpt
        tail = t - last_ckpt
        keep_tail = (saved or t >= self.fleet.horizon) and tail > 0
        if keep_tail:  # saved on SIGTERM, or still running at the end: the tail is kept
            seg = min(tail, interval)
            compute_kept += seg
            done, plain = work(diurnal, att, last_ckpt, last_ckpt + seg)
            work_kept += done
            plain_kept += plain
            if saved:
                truth.save_s += save
                record_checkpoint(att, t + save, work_kept)
            tail = max(0.0, tail - seg)
        truth.wasted_s += max(0.0, tail)
        truth.kept_compute_s += compute_kept
        truth.kept_work_s += work_kept
        truth.slowdown_s["diurnal"] += max(0.0, compute_kept - plain_kept)
        truth.slowdown_s["straggler"] += max(0.0, plain_kept - work_kept)
        job.steps_done = max(job.steps_done, att.base_step
                             + int(work_kept / cfg.step_time_s + 1e-9))

    # -- the port's signals
    def running(self, job_id: str, attempt: int) -> Attempt | None:
        """The job's current attempt if it is ``attempt`` and has not exited: what a signal
        or a stop may still act on (a late or repeated request finds None)."""
        job = self.fleet.jobs.get(job_id)
        att = job.attempt if job is not None else None
        if att is None or att.number != attempt or att.exited:
            return None
        return att

    def signal(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM: save and exit 75 if the save fits the grace period, else SIGKILL."""
        att = self.running(job_id, attempt)
        if att is None:
            return
        now = float(self.fleet.env.now)
        if not att.alive:  # crashed already: nothing to save, exit at once
            self._exit(att, EXIT_CRASH, f"cause={att.cause} crashed_at="
                                        f"{EPOCH_S + (att.stopped_at or now):.3f}")
            return
        if att.stopped_at is not None:
            return  # already saving on an earlier SIGTERM
        att.stopped_at = now
        att.token += 1
        if now < att.ready:  # nothing new since the checkpoint it resumes from
            att.alive = False
            self.settle(att, now, saved=False)
            self._exit(att, EXIT_PREEMPTED, "stopped during startup")
            return
        if not self._save_on_sigterm(att, now, grace_s):
            call_later(self.fleet.env, grace_s, self._sigkill, att)

    def stop(self, job_id: str, attempt: int) -> None:
        """SIGKILL now."""
        att = self.running(job_id, attempt)
        if att is None:
            return
        now = float(self.fleet.env.now)
        if att.alive:
            att.alive = False
            att.stopped_at = att.stopped_at if att.stopped_at is not None else now
            self.settle(att, att.stopped_at, saved=False)
        self._exit(att, EXIT_KILLED, "stopped")

    def _save_on_sigterm(self, att: Attempt, now: float, grace_s: float) -> bool:
        """Schedule the graceful exit if the save fits the grace period (False: it does
        not, SIGKILL comes). A periodic save under way finishes first."""
        env = self.fleet.env
        interval, save = cycle_of(att)
        cycle = interval + save
        into = (now - att.ready) % cycle
        final = final_save_s(att.job)
        if into >= interval:  # a periodic save is under way: let it finish
            done_at = now + (cycle - into)
            if done_at - now <= grace_s and att.job.plan is None:
                att.stopped_at = done_at
                call_later(env, done_at - now, self._graceful, att, done_at, False)
                return True
            if att.job.plan is not None and done_at - now + final <= grace_s:
                # the snapshot under way, then the save on SIGTERM (sent to the peer)
                att.stopped_at = done_at
                call_later(env, done_at - now + final, self._graceful, att, done_at, True)
                return True
        elif final <= grace_s:
            call_later(env, final, self._graceful, att, now, True)
            return True
        return False

    def _graceful(self, att: Attempt, stopped: float, save_now: bool) -> None:
        if att.exited or not att.alive:
            return
        self.settle(att, stopped, saved=save_now)
        att.alive = False
        if att.job.plan is not None:  # the library reports the save, then the process exits
            rec = self.fleet.sc.recovery
            delay = rec.report_before_exit_s if rec is not None else REPORT_BEFORE_EXIT_S
            call_later(self.fleet.env, delay, self._exit, att, EXIT_PREEMPTED,
                       "checkpoint saved on SIGTERM")
            return
        self._exit(att, EXIT_PREEMPTED, "checkpoint saved on SIGTERM")

    def _sigkill(self, att: Attempt) -> None:
        if att.exited:
            return
        if att.alive:
            att.alive = False
            self.settle(att, att.stopped_at or float(self.fleet.env.now), saved=False)
        self._exit(att, EXIT_KILLED, "killed after the grace period")

    def kill(self, att: Attempt, t: float, cause: str, *, hang: bool) -> None:
        """A node under the attempt failed: progress stops now, workers exit later."""
        if not att.alive or att.exited:
            return
        att.alive = False
        att.cause = cause
        att.token += 1
        stopped = t if att.stopped_at is None else min(att.stopped_at, t)
        att.stopped_at = stopped
        self.settle(att, stopped, saved=False)
        rec = self.fleet.sc.recovery
        if rec is not None and rec.recur_probability > 0 and cause in rec.recur_causes \
                and att.job.bug is None:
            att.job.bug = (cause, t)  # a bug of the program's: it may hit again
        cfg = att.job.cfg
        call_later(self.fleet.env, cfg.hang_exit_s if hang else cfg.crash_exit_s,
                   self._crash_exit, att)

    def _maybe_recur(self, att: Attempt, now: float) -> None:
        """The restarted program may hit its bug again (a restart loop) ``recur_after`` into
        its run, with the scenario's probability per restart, until the code fix lands."""
        job = att.job
        rec = self.fleet.sc.recovery
        assert rec is not None and job.bug is not None
        cause, first = job.bug
        at = att.ready + job.cfg.step_time_s + rec.recur_after_s
        if at >= first + rec.recur_fixed_after_s:
            job.bug = None  # fixed by then: the next fault of its kind is a new bug
            return
        if recovery_draws(self.fleet, job, att.number)[1] < rec.recur_probability:
            call_later(self.fleet.env, at - now, self._recur, att, att.token, cause)

    def _recur(self, att: Attempt, token: int, cause: str) -> None:
        if token != att.token or not att.alive or att.exited:
            return
        fleet = self.fleet
        now = float(fleet.env.now)
        fleet.failures[cause] += 1
        fleet.timeline.append((now, "fault", att.node_ids[0], cause))
        att.job.truth.interruptions[cause] += 1
        self.kill(att, now, cause, hang=False)

    def _crash_exit(self, att: Attempt) -> None:
        if not att.exited:
            self._exit(att, EXIT_CRASH, f"cause={att.cause} crashed_at="
                                        f"{EPOCH_S + (att.stopped_at or 0.0):.3f}")

    def _launch_failed(self, att: Attempt, broken: list[tuple[str, Fault | None]]) -> None:
        if att.exited or not att.alive:
            return
        fleet = self.fleet
        now = float(fleet.env.now)
        att.alive = False
        att.stopped_at = now
        self.settle(att, now, saved=False)
        for nid, fault in broken:
            if fault is not None and not fault.signal.empty:
                # the condition has been true since the fault, not since this launch: a
                # report with a new ``since`` reads as a second fault (``mtc sim fit``)
                self.agent.report_fault(fleet.nodes[nid], fault, fault.at)
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
        self.fleet.emit(JobWorkersExited(job_id=job.job_id, attempt=att.number,
                                         exit_code=code, detail=detail))

    # -- checkpoints and steps reported
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
        self.fleet.emit(JobCheckpointSaved(
            job_id=job.job_id, attempt=attempt, step=job.ckpt_step,
            path=f"sim://{job.job_id}/checkpoints/{checkpoint_name(job.ckpt_step)}",
            saved_at=EPOCH_S + job.ckpt_at, save_s=job.cfg.checkpoint_save_s))

    def _emit_tier(self, job: SimJob, attempt: int, step: int, at: float, tier: str) -> None:
        plan = job.plan
        assert plan is not None
        save = plan.save_s if tier == "memory" or len(plan.tiers) == 1 \
            else plan.lag_s[tier]  # what the copy to that tier took
        self.fleet.emit(JobCheckpointSaved(
            job_id=job.job_id, attempt=attempt, step=step,
            path=f"sim://{job.job_id}/{tier}/{checkpoint_name(step)}",
            saved_at=EPOCH_S + at, save_s=save, tier=tier))

    def _first_step(self, att: Attempt) -> None:
        """The workers log their first step: the accounting measures startup up to it."""
        if att.exited or (att.stopped_at is not None
                          and att.stopped_at < float(self.fleet.env.now)):
            return
        self.fleet.emit(JobFirstStep(job_id=att.job.job_id, attempt=att.number,
                                     step=att.base_step + 1))

    def _periodic_checkpoint(self, att: Attempt, token: int) -> None:
        if token != att.token or not att.alive or att.exited:
            return
        now = float(self.fleet.env.now)
        advance(self.diurnal, att, now)
        if att.job.ckpt_step > att.job.emitted_step:
            self._emit_checkpoint(att.job, att.number)
        interval, save = cycle_of(att)
        call_later(self.fleet.env, interval + save, self._periodic_checkpoint, att, token)

    def plan_completion(self, att: Attempt) -> None:
        """Schedule the final save and exit 0 when the job's work is done."""
        job = att.job
        cfg = job.cfg
        assert cfg.work_s is not None
        diurnal = self.diurnal
        remaining = cfg.work_s - att.base_step * cfg.step_time_s
        interval, save = cycle_of(att)
        cycle = interval + save
        now = float(self.fleet.env.now)
        advance(diurnal, att, max(att.ready, now))
        done = att.work_at_ckpt
        k = att.counted
        while True:  # walk the compute segments from the last counted checkpoint on
            seg0 = att.ready + k * cycle
            seg1 = seg0 + interval
            w = work(diurnal, att, seg0, seg1)[0]
            if done + w >= remaining:
                lo, hi = seg0, seg1
                for _ in range(60):
                    mid = (lo + hi) / 2
                    if done + work(diurnal, att, seg0, mid)[0] >= remaining:
                        hi = mid
                    else:
                        lo = mid
                finish = max(hi, now)
                break
            done += w
            k += 1
            if k - att.counted > 10_000_000:  # pragma: no cover - a job at zero speed
                return
        call_later(self.fleet.env, finish - now, self._complete, att, att.token, finish)

    def _complete(self, att: Attempt, token: int, finish: float) -> None:
        if token != att.token or not att.alive or att.exited:
            return
        att.stopped_at = finish
        self.settle(att, finish, saved=True)
        att.alive = False
        call_later(self.fleet.env, final_save_s(att.job), self._exit, att, EXIT_OK,
                   "training finished")

    def rearm_checkpoints(self, att: Attempt) -> None:
        """The periodic checkpoints of an attempt whose pace changed, from the next one on."""
        interval, save = cycle_of(att)
        cycle = interval + save
        now = float(self.fleet.env.now)
        k = max(1, math.ceil((now - att.ready) / cycle))
        call_later(self.fleet.env, att.ready + k * cycle - now, self._periodic_checkpoint, att,
                   att.token)

    def finish(self) -> None:
        """At the horizon: account the attempts still running (their progress is not lost)."""
        now = float(self.fleet.env.now)
        for job in self.fleet.jobs.values():
            att = job.attempt
            if att is not None and att.alive and not att.exited and att.stopped_at is None:
                att.stopped_at = now
                self.settle(att, now, saved=False)
