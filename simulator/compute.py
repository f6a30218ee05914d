"""The simulated Compute port: the fleet, provisioning and repairs on SimPy time.

:class:`SimCompute` implements ``shared.ports.Compute`` over a simulated fleet. Provisioning and
reset / reboot / reimage complete after sampled durations and answer with ``NodeProvisioned`` /
``NodeRepairCompleted`` and post-repair ``NodeHealthReported`` events that tell the truth: a
repair cheaper than the fault's true fix does not clear it. A request repeated for the same key
(node; node and repair attempt; job and attempt) is a no-op. Its workers are the analytic job
model (:mod:`simulator.jobs`), and the failure processes (:mod:`simulator.failure_processes`)
act on its nodes. What is reported once per key goes through the attempt/repair ledger that
every Compute adapter shares (``shared.adapters.compute.ledger``): an attempt starts once and
ends in one ``JobWorkersExited``, each checkpoint step is reported once, a repair runs once per
(node, attempt) and completes once; exit codes are the worker protocol's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import simpy

from shared.adapters.compute.ledger import MemoryLedger
from shared.domain.events import (
    Envelope,
    Event,
    JobCheckpointSaved,
    JobWorkersExited,
    NodeHealthReported,
    NodeProvisioned,
    NodeRepairCompleted,
    NodeRetired,
    NodeReturnedToService,
)
from shared.domain.health import ConditionType, RepairAction
from shared.domain.model import Node, NodeRole
from shared.ports import Gang
from simulator.bus import SimBus
from simulator.capacity import Capacity, rng_for
from simulator.clock import EPOCH_S, call_later
from simulator.failure_processes import FailureProcesses
from simulator.failures import (
    FailureModel,
    Fault,
    fault_conditions,
    healthy_conditions,
    repair_fixes,
)
from simulator.jobs import EXIT_CRASH, EXIT_KILLED, EXIT_PREEMPTED
from simulator.picking import Qualifying
from simulator.preflight_model import start_after
from simulator.scenario_types import Scenario
from simulator.slow_in_job import watch
from simulator.streams import FAILURES_DOMAIN, PROVISION_DOMAIN, REPAIR_DOMAIN
from simulator.tiers import mark_gone, tiered_attempt
from simulator.world import AGENT_SOURCE, COMPUTE_SOURCE, Attempt, SimJob, SimNode, regang

MAX_STARTS_AT_ONE_INSTANT = 1000  # attempts of one job at one simulated time: a livelock


class WedgedClock(RuntimeError):
    """The simulation stopped making progress in simulated time."""


class SimCompute(FailureProcesses):
    """The Compute port over a simulated fleet (see the module docstring).

    The port's methods, provisioning, repairs and the post-repair checks are here; the class
    inherits the failure processes (:class:`~simulator.failure_processes.FailureProcesses`),
    which inherit the job model (:class:`~simulator.jobs.JobModel`): three concerns, one
    module each, acting on the one fleet this class holds."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, bus: SimBus,
                 model: FailureModel, rng: np.random.Generator, *,
                 return_after_passes: int, heartbeat_timeout_s: float,
                 capacity: Capacity | None = None) -> None:
        self.env = env
        self.sc = scenario
        self.bus = bus
        self.model = model
        self.rng = rng
        self.return_after_passes = return_after_passes
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.nodes: dict[str, SimNode] = {}
        self.by_partition: dict[str, list[str]] = defaultdict(list)
        self.by_rack: dict[str, list[str]] = defaultdict(list)  # (nodes with a rack)
        self.jobs: dict[str, SimJob] = {}
        self.stragglers: dict[str, float] = {}
        self.slow_seen: set[tuple[str, int, str, float]] = set()
        self.preflight_until: dict[str, float] = {}
        self.unfit: set[str] = set()  # deleted, down or with a fault that blocks a launch
        self.drawable = Qualifying()  # by fleet position: may become a straggler
        self.positions: dict[str, int] = {}  # node id -> its position in the fleet's order
        self.fleet_order: list[SimNode] = []
        self._provisioning: set[str] = set()
        self._deep_checks: set[tuple[str, int]] = set()
        self.ledger = MemoryLedger()
        self.cordoned: set[str] = set()
        self.failures: dict[str, int] = defaultdict(int)  # root faults by cause (every node)
        self.repairs_done: dict[str, int] = defaultdict(int)
        self.planned = 0
        self.timeline: list[tuple[float, str, str, str]] = []  # (t, kind, node/job, detail)
        self.calls = 0
        self.horizon = math.inf
        self.failing = False  # node faults start with the run, not during bring-up
        # how capacity is bought (queue waits, spot preemptions) and the node-hour meter
        self.capacity = capacity or Capacity(env, scenario.availability,
                                             rng_for(0))
        bus.listen(self._observe, NodeReturnedToService, NodeRetired)

    def emit(self, event: Event, source: str = COMPUTE_SOURCE) -> None:
        """Every fact passes the ledger on its way out: once per key, as on real machines."""
        if isinstance(event, JobWorkersExited):
            once = self.ledger.end_attempt(event.job_id, event.attempt)
        elif isinstance(event, JobCheckpointSaved):
            once = self.ledger.checkpoint(event.path.rsplit("/", 1)[0], event.step,
                                          event.job_id, event.attempt, event.path, event.saved_at)
        elif isinstance(event, NodeRepairCompleted):
            once = self.ledger.end_repair(event.node_id, event.attempt, float(self.env.now))
        else:
            once = True
        if once:
            self.bus.emit(event, source)

    def _observe(self, envelope: Envelope) -> None:
        """The agent stops its post-repair checks once the control plane has decided: the
        node is back (or gone). A repair's start stops them in ``start_repair`` itself; its
        event, delivered later, must not stop the checks that follow the repair (with an
        instant repair they have started by then, and the node was lost in VERIFYING). A
        return announced before the current checks began is an older one: they go on."""
        event = envelope.event
        if isinstance(event, NodeReturnedToService | NodeRetired):
            node = self.nodes.get(event.node_id)
            if node is not None and envelope.time > node.verify_since:
                node.verify_token += 1

    def provision_nodes(self, nodes: Sequence[Node]) -> None:
        """``provision_node`` for each node, in order, with the new nodes' boot-time and
        failure streams seeded together first (``Streams.seed_many``: the same numbers)."""
        fresh = list(dict.fromkeys(n.node_id for n in nodes if n.node_id not in self._provisioning
                                   and n.node_id not in self.nodes))
        streams = self.model.streams
        streams.seed_many(PROVISION_DOMAIN, fresh)
        streams.seed_many(FAILURES_DOMAIN, fresh)
        for node in nodes:
            self.provision_node(node)

    def provision_node(self, node: Node) -> None:
        self.calls += 1
        if node.node_id in self._provisioning or node.node_id in self.nodes:
            return
        self._provisioning.add(node.node_id)
        replacement = node.replaces is not None
        rng = self.model.streams.rng(PROVISION_DOMAIN, node.node_id)
        if replacement:
            took = 0.0 if self.sc.repair.instant else \
                self.sc.repair.durations["replace"].sample(rng)
        else:
            took = self.sc.cluster.provision.sample(rng)
        # waiting for capacity (a queue's grant, a new spot VM) is not billed; booting is
        unbilled = self.capacity.arrival_wait(node.replaces)
        obtain = self.capacity.replacement_time(node.replaces)
        if obtain is not None:  # a new VM for a preempted one, not a hardware swap
            unbilled += obtain
            took = self.sc.cluster.provision.sample(rng)
        if node.role is NodeRole.WORKER:  # GPU nodes, spares included (not a login VM)
            self.capacity.meter.start(node.node_id, float(self.env.now) + unbilled)
        took += unbilled
        call_later(self.env, took, self._provisioned, node.node_id, node.partition,
                   node.role is NodeRole.WORKER, replacement, node.rack)

    def _provisioned(self, node_id: str, partition: str, worker: bool, replacement: bool,
                     rack: str = "") -> None:
        index = len(self.by_partition[partition])
        stream = self.model.node_stream(node_id, replacement=replacement)
        node = SimNode(node_id, partition, index, stream.multiplier, up=True,
                       replacement=replacement, stream=stream, rack=rack)
        if rack and worker:
            self.by_rack[rack].append(node_id)
        self.nodes[node_id] = node
        self.enlist(node)
        self._provisioning.discard(node_id)
        self.emit(NodeProvisioned(node_id=node_id))
        if not worker:
            return
        self.by_partition[partition].append(node_id)
        if replacement:
            self.repairs_done["replace"] += 1
            self.timeline.append((float(self.env.now), "replaced", node_id, ""))
        if self.failing:
            self._start_life(node)
            self.capacity.arm(node)
        self._verify(node)

    def cordon(self, node_id: str, reason: str) -> None:
        """No new work on the node: the control plane's own state already says so."""
        self.calls += 1
        self.cordoned.add(node_id)

    def uncordon(self, node_id: str) -> None:
        self.calls += 1
        self.cordoned.discard(node_id)

    def delete_node(self, node_id: str) -> None:
        self.calls += 1
        node = self.nodes.get(node_id)
        if node is None or node.deleted:
            return
        node.deleted = True
        node.up = False
        self.capacity.meter.stop(node_id, float(self.env.now))
        node.life_token += 1
        node.verify_token += 1
        self.stragglers.pop(node_id, None)
        self.fitness_changed(node)
        if node.attempt is not None and node.attempt.alive:
            mark_gone(node.attempt, node_id)
            self._kill(node.attempt, float(self.env.now), "node deleted", hang=False)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        self.calls += 1
        if not self.ledger.start_repair(node_id, attempt, RepairAction(action).value,
                                        float(self.env.now)):
            return
        node = self.nodes.get(node_id)
        if node is None:
            return
        node.verify_token += 1
        node.repairing = True
        node.repairs += 1
        # keyed by (node, repair number): other repairs' durations do not shift this one's
        rng = self.model.streams.rng(REPAIR_DOMAIN, node_id, node.repairs)
        instant = self.sc.repair.instant
        took = 0.0 if instant else self.sc.repair.durations[action.value].sample(rng)
        mech_ok = instant or rng.random() >= self.sc.repair.mechanical_failure.get(
            action.value, 0.0)
        self.timeline.append((float(self.env.now), "repair", node_id, action.value))
        call_later(self.env, took, self._repaired, node, action, attempt, mech_ok)

    def _repaired(self, node: SimNode, action: RepairAction, attempt: int,
                  mech_ok: bool) -> None:
        node.repairing = False
        if node.deleted:
            return
        fault = node.fault
        # an instant repair (scenario ``repair.instant``) clears whatever the fault was
        fixes = fault is None or self.sc.repair.instant or repair_fixes(action, fault.fix)
        if fault is not None and fault.signal.node_down and not fixes:
            ok, detail = False, f"node did not come back after {action.value}"
        elif not mech_ok:
            ok, detail = False, f"{action.value} failed"
        else:
            ok, detail = True, ""
            self.repairs_done[action.value] += 1
            if fixes:
                node.fault = None
                if self.stragglers.pop(node.node_id, None) is not None:
                    node.straggle = 1.0
                self.fitness_changed(node)
                if self.failing:
                    self._renew_life(node)
        self.emit(NodeRepairCompleted(node_id=node.node_id, action=action.value,
                                      attempt=attempt, ok=ok, detail=detail))
        if ok:
            self._verify(node)

    # DCGM level 3 on 8 GPUs (tens of minutes) plus the collective test, in simulated seconds
    DEEP_CHECK_S = 2700.0

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """Deep checks once per (node, attempt), reporting after ``DEEP_CHECK_S``: a node
        with a fault fails DCGM level 3 (the simulated fleet's checks see its faults, as its
        post-repair checks do); a sound one passes both."""
        self.calls += 1
        node = self.nodes.get(node_id)
        if node is None or (node_id, attempt) in self._deep_checks:
            return
        self._deep_checks.add((node_id, attempt))
        call_later(self.env, self.DEEP_CHECK_S, self._deep_checked, node, attempt)

    def _deep_checked(self, node: SimNode, attempt: int) -> None:
        if node.deleted:
            return
        observed = EPOCH_S + float(self.env.now)
        fault = node.fault
        failed = fault is not None and not fault.signal.empty
        dcgm = ("true", f"simulated fault: {fault.cause.name}") if failed and fault else (
            "false", "simulated node: passed")
        details = {"deep_check_attempt": attempt}
        conditions = (
            {"type": ConditionType.DCGM_DIAG_FAILED.value, "status": dcgm[0], "reason": dcgm[1],
             "since": observed, "details": {**details, "level": 3}},
            {"type": ConditionType.COLLECTIVE_BANDWIDTH_LOW.value, "status": "false",
             "reason": "simulated node: passed", "since": observed,
             "details": {**details, "corrupt": False}},
        )
        self.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                     conditions=conditions, source="deep-check"), AGENT_SOURCE)

    def start_workers(self, gang: Gang) -> None:
        self.calls += 1
        if not self.ledger.start_attempt(gang.job_id, gang.attempt, gang.world_size,
                                         gang.checkpoint_dir, float(self.env.now)):
            return
        job = self.jobs.get(gang.job_id)
        if job is None:
            return
        now = float(self.env.now)
        self._check_wedged(job, now)
        begin = start_after(self, job.job_id, now)  # after its preflight, if one ran
        cfg = job.cfg
        node_ids = gang.node_ids  # by rank already: no per-rank work per restart
        old = job.attempt
        startup = cfg.startup_s + cfg.warmup_s  # a slow first step is startup too
        if job.plan is None:
            restore = cfg.checkpoint_restore_s if job.ckpt_step >= 0 else 0.0
            att = Attempt(job, gang.attempt, node_ids, begin, begin + startup + restore,
                          max(job.ckpt_step, 0))
        else:  # warm or cold, restored from the tier of the newest surviving entry
            att = tiered_attempt(job, gang, begin)
            startup = att.boot
        job.attempt = att
        job.truth.attempts += 1
        broken = self._seat(job, old, att, now)
        att.factors.append((now, self._slowest(att)))
        watch(self, att)
        if broken:
            job.truth.failed_launches += 1
            fail_at = min(cfg.launch_fail_s, startup)
            att.cause = broken[0][1].cause.name if broken[0][1] is not None else "node_missing"
            call_later(self.env, fail_at, self._launch_failed, att, broken)
            return
        if cfg.work_s is not None:
            self._plan_completion(att)
        call_later(self.env, att.ready + cfg.step_time_s - now, self._first_step, att)
        if self.sc.checkpoint_events == "all":
            call_later(self.env, att.ready + cfg.checkpoint_interval_s + cfg.checkpoint_save_s
                       - now, self._periodic_checkpoint, att, att.token)

    # a gang with more nodes than this joining, leaving or unfit is seated node by node
    RESEAT_ALL_OVER = 64

    def _seat(self, job: SimJob, old: Attempt | None, att: Attempt, now: float
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
            special = joined | (members & job.lost) | (members & self.unfit) | (
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
        get = self.nodes.get
        for nid in order:
            node = get(nid)
            if node is None or node.deleted or not node.up:
                broken.append((nid, None))
                unseated.append(nid)
                if node is not None and node.seat is job:
                    self._unseat(node, old)  # no new attempt starts here
                continue
            seat = node.seat
            prev = old if seat is job else node.attempt
            if prev is not None and prev.alive and prev is not att:
                mark_gone(prev, nid)
                self._kill(prev, now, "node taken by another attempt", hang=False)
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
                    self._unseat(node, old)
        return broken

    @staticmethod
    def _unseat(node: SimNode, old: Attempt | None) -> None:
        """The node's job moved on without it: its attempt is the old one, which counts as
        none once over (pinned only while it still runs)."""
        node.seat = None
        if old is not None and old.alive and not old.exited:
            node.pinned = old

    def _check_wedged(self, job: SimJob, now: float) -> None:
        """A job started again and again at one simulated instant is a livelock (with zero
        delays nothing moves the clock on): the run stops with a :class:`WedgedClock` that
        names it, instead of spinning and growing for ever. Raised from a timer, outside the
        handler that called us, so the bus cannot take it for a handler error."""
        if job.same_instant[0] != now:
            job.same_instant = (now, 0)
        job.same_instant = (now, job.same_instant[1] + 1)
        if job.same_instant[1] == MAX_STARTS_AT_ONE_INSTANT:
            call_later(self.env, 0.0, self._wedged, job.job_id, now)

    def _wedged(self, job_id: str, now: float) -> None:
        raise WedgedClock(f"job {job_id} started {MAX_STARTS_AT_ONE_INSTANT} times at "
                          f"simulated t={now:.3f} s (day {now / 86_400:.1f}): the clock is wedged")

    def _running(self, job_id: str, attempt: int) -> Attempt | None:
        """The job's current attempt if it is ``attempt`` and has not exited: what a signal
        or a stop may still act on (a late or repeated request finds None)."""
        job = self.jobs.get(job_id)
        att = job.attempt if job is not None else None
        if att is None or att.number != attempt or att.exited:
            return None
        return att

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        self.calls += 1
        att = self._running(job_id, attempt)
        if att is None:
            return
        now = float(self.env.now)
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
            self._settle(att, now, saved=False)
            self._exit(att, EXIT_PREEMPTED, "stopped during startup")
            return
        if not self._save_on_sigterm(att, now, grace_s):
            call_later(self.env, grace_s, self._sigkill, att)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self.calls += 1
        att = self._running(job_id, attempt)
        if att is None:
            return
        now = float(self.env.now)
        if att.alive:
            att.alive = False
            att.stopped_at = att.stopped_at if att.stopped_at is not None else now
            self._settle(att, att.stopped_at, saved=False)
        self._exit(att, EXIT_KILLED, "stopped")

    def _verify(self, node: SimNode) -> None:
        """Post-provision / post-repair checks: the agent reports until the node is back."""
        node.verify_token += 1
        node.verify_since = EPOCH_S + float(self.env.now)
        call_later(self.env, self.sc.repair.verify_interval_s, self._verify_report, node,
                   node.verify_token, 1)

    def _verify_report(self, node: SimNode, token: int, n: int) -> None:
        if token != node.verify_token or node.deleted:
            return
        now = float(self.env.now)
        observed = EPOCH_S + now
        fault = node.fault
        if fault is not None:
            if not fault.signal.empty and not fault.signal.node_down:
                self.emit(NodeHealthReported(
                    node_id=node.node_id, observed_at=observed,
                    conditions=fault_conditions(fault.signal, observed, observed,
                                                fault.cause.name),
                    source="post-repair-check"), AGENT_SOURCE)
            return
        if n == 1:  # the first pass of these checks: every condition first seen now
            node.passing = healthy_conditions(observed)
        self.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                     conditions=node.passing, source="post-repair-check"),
                  AGENT_SOURCE)
        if n < self.return_after_passes + 3:
            call_later(self.env, self.sc.repair.verify_interval_s, self._verify_report, node,
                       token, n + 1)
