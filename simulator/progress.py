"""An attempt's progress in numbers: its checkpoint cycle, the work done over a span, and the
periodic checkpoints completed by a time. Pure functions of the attempt and the diurnal
slowdown, shared by the job model (:mod:`simulator.jobs`) and the tiers
(:mod:`simulator.tiers`).
"""

from __future__ import annotations

import math
from functools import reduce
from itertools import repeat
from operator import add

from simulator.clock import EPOCH_S
from simulator.failures import Diurnal, diurnal_integral, diurnal_spans
from simulator.world import Attempt, SimJob


def cycle_of(att: Attempt) -> tuple[float, float]:
    """(compute between checkpoints, the blocking save) of the attempt's job."""
    plan = att.job.plan
    if plan is not None:  # a snapshot (tier 1) or a synchronous durable save per cycle
        return plan.interval_s, plan.save_s
    cfg = att.job.cfg
    return cfg.checkpoint_interval_s, cfg.checkpoint_save_s


def final_save_s(job: SimJob) -> float:
    """The save on SIGTERM or at the end of training."""
    return job.plan.final_save_s if job.plan is not None else job.cfg.checkpoint_save_s


def work(diurnal: Diurnal, att: Attempt, t0: float, t1: float) -> tuple[float, float]:
    """Nominal work (seconds at full speed) done computing over [t0, t1], and the same with
    stragglers left out (diurnal slowdown only)."""
    if t1 <= t0:
        return 0.0, 0.0
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


def advance(diurnal: Diurnal, att: Attempt, t: float) -> None:
    """Account the periodic checkpoints that completed by ``t``."""
    interval, save = cycle_of(att)
    cycle = interval + save
    n = int((t - att.ready + 1e-6) // cycle)
    if n <= att.counted:
        return
    truth = att.job.truth
    factors = att.factors
    if len(factors) == 1 and factors[0][1] == 1.0:  # at full speed: what the loop below
        # adds, span by span in the same order (``reduce``: the same sums, in C)
        spans = diurnal_spans(diurnal, att.ready, att.counted, n, interval, cycle, EPOCH_S)
        att.work_at_ckpt = reduce(add, spans, att.work_at_ckpt)
        att.plain_at_ckpt = reduce(add, spans, att.plain_at_ckpt)
        truth.save_s = reduce(add, repeat(save, n - att.counted), truth.save_s)
        att.counted = n
    while att.counted < n:
        c0 = att.ready + att.counted * cycle
        done, plain = work(diurnal, att, c0, c0 + interval)
        att.work_at_ckpt += done
        att.plain_at_ckpt += plain
        att.counted += 1
        truth.save_s += save
    record_checkpoint(att, att.ready + n * cycle, att.work_at_ckpt)


def record_checkpoint(att: Attempt, at: float, done: float) -> None:
    """The job's newest checkpoint is the one with ``done`` seconds of work, made at ``at``
    (a tiered job's: known only when progress stops)."""
    job = att.job
    if job.plan is not None:
        return
    step = att.base_step + int(done / job.cfg.step_time_s + 1e-9)
    if step > job.ckpt_step:
        job.ckpt_step = step
        job.ckpt_at = at
