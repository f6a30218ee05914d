"""Checkpoint tiers in the job model: which entry survives an incident, what the
next attempt restores from, and how long it starts.

A tiered job snapshots its state every ``TierPlan.interval_s`` of compute (the step blocks for
the copy to host memory, ``save_s``); every snapshot is a tier-1 (memory) entry, every
``every[peer]``-th is also sent to the buddy node (tier 2) and every ``every[durable]``-th to
durable storage (tier 3), each complete ``lag_s`` after the snapshot (asynchronous: no tier
is written faster than its bandwidth). When progress stops:

- nothing lost (a program crash, a hang, a planned stop): every tier survives, tier 1 is the
  newest;
- a node lost or taken for a repair (its fault has a fix, it was deleted or taken): its tier-1
  entries go with it; its ranks' tier-2 copies live on its buddy (the node half a gang away,
  so a switch or rack taking neighbours keeps them), lost only if the buddy went too; the
  newest step complete for every rank (the consistent cut) is then the newest tier-2 entry
  (or tier-3 when a buddy pair went);
- a save on SIGTERM is a snapshot sent on to the peer tier (durable without one) before the
  exit: everything is kept.

The cut's step and tier become the job's checkpoint (``JobCheckpointSaved.tier``): the next
attempt restores from that tier in size / bandwidth. Its startup is warm (processes
restarted, runtime up; its time by mode, teardown and communicator rebuild included) for an
in-place restart, a scale-down and a hot swap onto a warm spare, cold for a requeue
(``Gang.recovery`` None), a first start and a cold spare; a warm or near-tier recovery may
fail and fall back to a cold start from durable storage (:func:`start_costs`).

:class:`Tiers` is the job model's collaborator for a tiered job's stops; it holds the fleet.
"""

from __future__ import annotations

from shared.policies.recovery import Mode, Tier
from shared.ports import Gang, RecoveryPlan
from simulator.fleet import Fleet
from simulator.progress import advance, work
from simulator.recovery_config import TierPlan
from simulator.streams import RECOVERY_DOMAIN
from simulator.world import Attempt, SimJob

MEMORY, PEER, DURABLE = Tier.MEMORY.value, Tier.PEER.value, Tier.DURABLE.value
WARM_MODES = (Mode.IN_PLACE.value, Mode.SCALE_DOWN.value, Mode.HOT_SWAP.value)


def mark_gone(att: Attempt, node_id: str) -> None:
    """The node's memory is lost to the attempt (a fault to repair, a deletion)."""
    if att.job.plan is None:
        return
    if att.gone is None:
        att.gone = set()
    att.gone.add(node_id)


def buddy_lost(att: Attempt, gone: set[str]) -> bool:
    """Did a node and its buddy (the node ``n // 2`` ranks on) both go?"""
    ids = att.node_ids
    n = len(ids)
    if n < 2 or len(gone) < 2:
        return False
    index = {nid: i for i, nid in enumerate(ids) if nid in gone}
    return any(ids[(i + n // 2) % n] in gone for i in index.values())


def surviving(plan: TierPlan, att: Attempt, gone: set[str]) -> tuple[str, ...]:
    """The tiers whose entries every rank can still read, newest-first preference order."""
    if not gone:
        return plan.tiers
    if PEER in plan.tiers and not buddy_lost(att, gone):
        return (PEER, DURABLE)
    return (DURABLE,)


class Tiers:
    """A tiered job's stops: which entries survive, and the checkpoint the next attempt reads
    (see the module docstring)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def settle(self, att: Attempt, t: float, *, saved: bool) -> bool:
        """The job model's settling for a tiered job: progress stops at ``t``; the truth
        ledger gets the attempt's time, the job its newest surviving checkpoint (step, time,
        tier). True when progress had begun: the job model then reports what became known."""
        fleet = self.fleet
        diurnal = fleet.sc.failures.diurnal
        job = att.job
        plan = job.plan
        assert plan is not None
        cfg = job.cfg
        truth = job.truth
        startup_end = att.start + att.boot
        truth.startup_s += max(0.0, min(t, startup_end) - att.start)
        restored = max(0.0, min(t, att.ready) - startup_end)
        truth.restore_s += restored
        if att.restored_from:
            truth.restore_by_tier[att.restored_from] += restored
        if t <= att.ready:
            return False
        interval, save = plan.interval_s, plan.save_s
        cycle = interval + save
        advance(diurnal, att, t)
        counted = att.counted
        keep_tail = saved or t >= fleet.horizon
        if keep_tail:
            near = MEMORY in plan.tiers and not (saved and plan.sigterm_durable)
            n_cut, tier = counted, MEMORY if near else DURABLE
        else:
            n_cut, tier = _cut(plan, att, t, counted, cycle, att.gone or set())
        work_kept, plain_kept = att.work_at_ckpt, att.plain_at_ckpt
        for j in range(n_cut, counted):  # the snapshots after the cut are lost with the tail
            done, plain = work(diurnal, att, att.ready + j * cycle,
                               att.ready + j * cycle + interval)
            work_kept -= done
            plain_kept -= plain
        compute_kept = n_cut * interval
        wasted = (counted - n_cut) * interval
        last_ckpt = att.ready + counted * cycle
        tail = t - last_ckpt
        if keep_tail and tail > 0:  # saved on SIGTERM, or still running at the end: kept
            seg = min(tail, interval)
            compute_kept += seg
            done, plain = work(diurnal, att, last_ckpt, last_ckpt + seg)
            work_kept += done
            plain_kept += plain
            tail = max(0.0, tail - seg)
            if saved:
                truth.save_s += plan.final_save_s
                if self._gone_on_sigterm(att) and not plan.sigterm_durable:
                    tier = PEER if PEER in plan.tiers else DURABLE
                _set_checkpoint(job, att, t + plan.final_save_s, work_kept, tier)
        elif n_cut > 0:
            _set_checkpoint(job, att, att.ready + n_cut * cycle, work_kept, tier)
        elif job.ckpt_step >= 0 and job.ckpt_tier not in surviving(plan, att, att.gone or set()):
            job.ckpt_tier = tier  # nothing newer: the entry it resumed from, read from there
        gone = att.gone or set()
        if saved and keep_tail:
            gone = self._gone_on_sigterm(att)
        held = surviving(plan, att, gone)
        self._note_entries(att, plan, t, counted, cycle, held)
        if saved and keep_tail and plan.sigterm_durable:  # the save on SIGTERM is durable
            job.tier_newest[DURABLE] = (job.ckpt_step, job.ckpt_at)
        elif saved and keep_tail:  # the save on SIGTERM is in memory (if kept) and on the peer
            for kept in held:
                if kept != DURABLE:
                    job.tier_newest[kept] = (job.ckpt_step, job.ckpt_at)
        elif gone and MEMORY in plan.tiers and job.ckpt_step > job.tier_newest.get(
                MEMORY, (-1, 0.0))[0]:
            # the ranks that stayed hold the cut in memory too (every snapshot is a tier-1
            # entry); what they hold beyond it the lost ranks cannot match, so it is not
            # reported
            job.tier_newest[MEMORY] = (job.ckpt_step, job.ckpt_at)
        truth.wasted_s += wasted + max(0.0, tail)
        truth.kept_compute_s += compute_kept
        truth.kept_work_s += work_kept
        truth.slowdown_s["diurnal"] += max(0.0, compute_kept - plain_kept)
        truth.slowdown_s["straggler"] += max(0.0, plain_kept - work_kept)
        job.steps_done = max(job.steps_done,
                             att.base_step + int(work_kept / cfg.step_time_s + 1e-9))
        return True

    def _gone_on_sigterm(self, att: Attempt) -> set[str]:
        """The nodes that leave with this stop: lost ones, and those with a fault to repair."""
        gone = set(att.gone or ())
        nodes = self.fleet.nodes
        for nid in att.node_ids:
            node = nodes.get(nid)
            if node is None or node.deleted or node.fault is not None:
                gone.add(nid)
        return gone

    def _note_entries(self, att: Attempt, plan: TierPlan, t: float, counted: int,
                      cycle: float, tiers: tuple[str, ...]) -> None:
        """Each surviving tier's newest entry complete by ``t`` (this attempt's snapshots):
        what the program's library reports (``JobCheckpointSaved.tier``)."""
        newest: dict[str, int] = {}
        for tier in tiers:
            k = plan.every[tier]
            n = counted - counted % k
            while n > 0 and att.ready + n * cycle + plan.lag_s[tier] > t:
                n -= k
            if n > 0:
                newest[tier] = n
        if not newest:
            return
        diurnal = self.fleet.sc.failures.diurnal
        job = att.job
        done, j = att.work_at_ckpt, counted
        for tier, n in sorted(newest.items(), key=lambda kv: -kv[1]):
            while j > n:  # the work at snapshot n: less the snapshots after it
                j -= 1
                done -= work(diurnal, att, att.ready + j * cycle, att.ready + j * cycle
                             + plan.interval_s)[0]
            step = att.base_step + int(done / job.cfg.step_time_s + 1e-9)
            if step > job.tier_newest.get(tier, (-1, 0.0))[0]:
                job.tier_newest[tier] = (step, att.ready + n * cycle)


def _cut(plan: TierPlan, att: Attempt, t: float, counted: int, cycle: float,
         gone: set[str]) -> tuple[int, str]:
    """(snapshot number, tier) of the newest entry every rank can read at ``t``; 0: the
    entry the attempt resumed from (it is where every tier starts again)."""
    tiers = surviving(plan, att, gone)
    best, best_tier = 0, tiers[0]
    for tier in tiers:
        k = plan.every[tier]
        n = counted - counted % k
        while n > 0 and att.ready + n * cycle + plan.lag_s[tier] > t:
            n -= k  # the newest one still in flight when progress stopped is not complete
        if n > best:  # (ties keep the faster, lower tier: surviving() lists it first)
            best, best_tier = n, tier
    return best, best_tier


def _set_checkpoint(job: SimJob, att: Attempt, at: float, work: float, tier: str) -> None:
    step = att.base_step + int(work / job.cfg.step_time_s + 1e-9)
    if step >= job.ckpt_step:
        job.ckpt_step = step
        job.ckpt_at = at
        job.ckpt_tier = tier


def recovery_draws(fleet: Fleet, job: SimJob, attempt: int) -> tuple[float, float]:
    """The attempt's uniform draws (fallback, recurrence), from their own stream keyed by
    (job, attempt): other randomness is untouched, and none is drawn without the knobs."""
    rec = fleet.sc.recovery
    if rec is None or (rec.fallback_probability <= 0 and rec.recur_probability <= 0):
        return 1.0, 1.0
    u = fleet.model.streams.rng(RECOVERY_DOMAIN, job.job_id, attempt).random(2)
    return float(u[0]), float(u[1])


def start_costs(job: SimJob, gang: Gang, u: float = 1.0) -> tuple[float, float, str]:
    """(startup, restore, tier restored from) of a tiered job's new attempt. ``u`` is the
    attempt's uniform draw for a fallback: below ``plan.fallback_probability`` a warm
    restart or a near-tier restore fails (a corrupted context, a bad local entry) and the
    attempt pays that try, then a cold start from the durable entry; the progress since that
    entry is computed again before the first new step, so it is part of the startup."""
    plan = job.plan
    assert plan is not None
    recovery: RecoveryPlan | None = gang.recovery
    warm = recovery is not None and recovery.mode in WARM_MODES and job.ckpt_step >= 0
    if warm and recovery is not None and recovery.fresh_node_ids and not plan.spares_warm:
        warm = False  # a cold spare: the whole gang waits for it
    warm_s = plan.startup_by_mode.get(recovery.mode, plan.startup_warm_s) \
        if warm and recovery is not None else 0.0
    startup = (warm_s if warm else plan.startup_cold_s) + job.cfg.warmup_s
    if job.ckpt_step < 0:
        return startup, 0.0, ""
    tier = job.ckpt_tier if job.ckpt_tier in plan.restore_s else DURABLE
    if u < plan.fallback_probability and (warm or tier != DURABLE):
        durable_step = job.tier_newest.get(DURABLE, (0, 0.0))[0]
        redo = max(0, job.ckpt_step - durable_step) * job.cfg.step_time_s
        tried = warm_s + plan.restore_s[tier]
        return (tried + plan.startup_cold_s + job.cfg.warmup_s + redo,
                plan.restore_s[DURABLE], DURABLE)
    return startup, plan.restore_s[tier], tier


def tiered_attempt(job: SimJob, gang: Gang, now: float, u: float = 1.0) -> Attempt:
    """A tiered job's new attempt: warm or cold, restored from the tier of the newest
    surviving entry, at the pace of its gang (a scale-down has fewer data-parallel
    replicas for the same global batch); ``u``: see :func:`start_costs`."""
    startup, restore, tier = start_costs(job, gang, u)
    return Attempt(job, gang.attempt, gang.node_ids, now, now + startup + restore,
                   max(job.ckpt_step, 0), boot=startup, restored_from=tier,
                   scale=min(1.0, len(gang.node_ids) / job.cfg.nodes))
