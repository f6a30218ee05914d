"""Launching an attempt on the simulated fleet: seating it on its gang's nodes.

A restart keeps most of its nodes, so an attempt is seated on only the nodes that changed
(joined, left, taken by another job, unfit, or not seated at the last start); an attempt still
running on a node it loses is killed there; the nodes it cannot launch on make the launch fail.
A job started again and again at one simulated instant stops the run (:class:`WedgedClock`).
:class:`Launches` holds the fleet, the job model (which runs the attempt), the stragglers (its
pace) and slow-in-job (which watches it).
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.ports import Gang
from simulator.clock import call_later
from simulator.failures import Fault
from simulator.fleet import Fleet
from simulator.jobs import JobModel
from simulator.preflight_model import start_after
from simulator.slow_in_job import SlowInJob
from simulator.stragglers import Stragglers
from simulator.tiers import mark_gone, recovery_draws, tiered_attempt
from simulator.world import Attempt, SimJob, SimNode, regang

MAX_STARTS_AT_ONE_INSTANT = 1000  # attempts of one job at one simulated time: a livelock


class WedgedClock(RuntimeError):
    """The simulation stopped making progress in simulated time."""


class Launches:
    """``start_workers``: a new attempt, seated on its nodes (see the module)."""

    # a gang with more nodes than this joining, leaving or unfit is seated node by node
    RESEAT_ALL_OVER = 64

    def __init__(self, fleet: Fleet, job_model: JobModel, stragglers: Stragglers,
                 slow: SlowInJob) -> None:
        self.fleet = fleet
        self.job_model = job_model
        self.stragglers = stragglers
        self.slow = slow

    def start(self, gang: Gang) -> None:
        fleet = self.fleet
        if not fleet.ledger.start_attempt(gang.job_id, gang.attempt, gang.world_size,
                                          gang.checkpoint_dir, float(fleet.env.now)):
            return
        job = fleet.jobs.get(gang.job_id)
        if job is None:
            return
        now = float(fleet.env.now)
        self._check_wedged(job, now)
        begin = start_after(fleet, job.job_id, now)  # after its preflight, if one ran
        cfg = job.cfg
        node_ids = gang.node_ids  # by rank already: no per-rank work per restart
        old = job.attempt
        startup = cfg.startup_s + cfg.warmup_s  # a slow first step is startup too
        if job.plan is None:
            restore = cfg.checkpoint_restore_s if job.ckpt_step >= 0 else 0.0
            att = Attempt(job, gang.attempt, node_ids, begin, begin + startup + restore,
                          max(job.ckpt_step, 0))
        else:  # warm or cold, restored from the tier of the newest surviving entry
            att = tiered_attempt(job, gang, begin, recovery_draws(fleet, job, gang.attempt)[0])
            startup = att.boot
        job.attempt = att
        job.truth.attempts += 1
        broken = self.seat(job, old, att, now)
        att.factors.append((now, self.stragglers.pace(att)))
        self.slow.watch(att)
        self.job_model.begin(att, broken, startup)

    def seat(self, job: SimJob, old: Attempt | None, att: Attempt, now: float
             ) -> list[tuple[str, Fault | None]]:
        """Seat ``att`` on its nodes; returns the nodes it cannot launch on, in rank order
        (missing, deleted or down: ``(id, None)``; a fault that blocks a launch: the fault).

        A restart keeps most of its nodes: those stay seated with the job, so only the nodes
        that joined, left, were taken by another job, are unfit or were not seated at the
        last start (set operations over the gang, in C) are looked at, in rank order, as a
        full pass over every rank would (a 2,048-node gang, 500 restarts a run)."""
        joined, left = regang(job, old, att, self.RESEAT_ALL_OVER)
        members = job.gang  # now the new attempt's
        if old is None or (old.alive and not old.exited):
            special = None  # the first start, or the old attempt still runs: every rank
        else:
            # a member missing now was missing then: nodes are only ever added to the fleet
            special = joined | (members & job.lost) | (members & self.fleet.unfit) | (
                members & old.unseated)
            if len(special) > self.RESEAT_ALL_OVER:
                special = None
        if special is None:
            order: Iterable[str] = att.node_ids
        else:
            index = att.node_ids.index
            order = sorted(special, key=index)
        broken: list[tuple[str, Fault | None]] = []
        unseated = []
        get = self.fleet.nodes.get
        kill = self.job_model.kill
        for nid in order:
            node = get(nid)
            if node is None or node.deleted or not node.up:
                broken.append((nid, None))
                unseated.append(nid)
                if node is not None and node.seat is job:
                    _unseat(node, old)  # no new attempt starts here
                continue
            seat = node.seat
            prev = old if seat is job else node.attempt
            if prev is not None and prev.alive and prev is not att:
                mark_gone(prev, nid)
                kill(prev, now, "node taken by another attempt", hang=False)
            if seat is not job:
                if seat is not None:
                    seat.lost.add(nid)
                node.seat = job
            node.pinned = None
            fault = node.fault
            if fault is not None and fault.signal.blocks_launch:
                broken.append((nid, fault))
        if unseated:
            att.unseated = frozenset(unseated)
        job.lost.clear()
        if old is not None:
            for nid in left:
                node = get(nid)
                if node is not None and node.seat is job:
                    _unseat(node, old)
        return broken

    def _check_wedged(self, job: SimJob, now: float) -> None:
        """A job started again and again at one simulated instant is a livelock (with zero
        delays nothing moves the clock on): the run stops with a :class:`WedgedClock` that
        names it, instead of spinning and growing for ever. Raised from a timer, outside the
        handler that called us, so the bus cannot take it for a handler error."""
        if job.same_instant[0] != now:
            job.same_instant = (now, 0)
        job.same_instant = (now, job.same_instant[1] + 1)
        if job.same_instant[1] == MAX_STARTS_AT_ONE_INSTANT:
            call_later(self.fleet.env, 0.0, _wedged, job.job_id, now)


def _unseat(node: SimNode, old: Attempt | None) -> None:
    """The node's job moved on without it: its attempt is the old one, which counts as none
    once over (pinned only while it still runs)."""
    node.seat = None
    if old is not None and old.alive and not old.exited:
        node.pinned = old


def _wedged(job_id: str, now: float) -> None:
    raise WedgedClock(f"job {job_id} started {MAX_STARTS_AT_ONE_INSTANT} times at "
                      f"simulated t={now:.3f} s (day {now / 86_400:.1f}): the clock is wedged")
