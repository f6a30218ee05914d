"""Simulation adapters: the ports of ``shared/ports.py`` implemented on SimPy time.

- :class:`SimClock` reads SimPy's clock (seconds since a fixed epoch).
- :class:`SimBus` is the Publisher: it delivers every envelope to ``routing.subscribers(type)``
  through the real ``run_handler`` (idempotency, staleness, outbox) after a sampled latency,
  and can duplicate and reorder deliveries; a handler that raises is redelivered later, as
  Pub/Sub would.
- :class:`SimCompute` is the Compute port. Provisioning and reset / reboot / reimage complete
  after sampled durations and answer with ``NodeProvisioned`` / ``NodeRepairCompleted`` and
  post-repair ``NodeHealthReported`` events that tell the truth: a repair cheaper than the
  fault's true fix does not clear it. Its workers are the analytic job model: an attempt makes
  progress at ``speed / step_time`` steps per second (no event per step), checkpoints on a
  fixed compute-time schedule, saves and exits 75 on SIGTERM, and dies at once when a node
  under it fails (progress since the last checkpoint is lost).

The failure processes (node faults, stragglers, planned restarts) live here too because they
act on the same nodes and attempts; they only *emit events*, never touch the store.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from shared.adapters.docstore import make_envelope
from shared.domain.errors import PermanentError
from shared.domain.events import (
    Envelope,
    Event,
    JobCheckpointSaved,
    JobInterruptRequested,
    JobWorkersExited,
    NodeHealthReported,
    NodeProvisioned,
    NodeRepairCompleted,
    NodeRepairStarted,
    NodeRetired,
    NodeReturnedToService,
)
from shared.domain.health import RepairAction
from shared.domain.model import Node, NodeRole
from shared.handling import Deps, Outcome, run_handler
from shared.ports import WorkerSpec
from shared.routing import subscribers
from simulator.failures import (
    FailureModel,
    Fault,
    diurnal_integral,
    fault_conditions,
    healthy_conditions,
    repair_fixes,
)
from simulator.scenario import BusCfg, JobCfg, Scenario

log = logging.getLogger("mtc.sim")
EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z: simulated time zero
EXIT_OK = 0
EXIT_CRASH = 1
EXIT_PREEMPTED = 75  # examples/train.py: "preempted, checkpoint saved, run me again"
EXIT_KILLED = 137  # SIGKILL after the grace period
COMPUTE_SOURCE = "//mtc/sim/compute"
AGENT_SOURCE = "//mtc/sim/agent"
OPERATOR_SOURCE = "//mtc/sim/operator"


class SimClock:
    """The Clock port: epoch seconds, driven by SimPy."""

    def __init__(self, env: simpy.Environment, epoch_s: float = EPOCH_S) -> None:
        self.env = env
        self.epoch_s = epoch_s

    def now(self) -> float:
        return self.epoch_s + float(self.env.now)


def call_later(env: simpy.Environment, delay: float, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(*args)`` after ``delay`` simulated seconds: one SimPy timeout, no process."""
    ev = env.timeout(max(0.0, delay))
    ev.callbacks.append(lambda _ev: fn(*args))


# ---------------------------------------------------------------- bus


@dataclass
class BusStats:
    published: int = 0
    delivered: int = 0
    duplicates: int = 0
    reordered: int = 0
    retries: int = 0
    gave_up: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    handler_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_type: dict[str, int] = field(default_factory=lambda: defaultdict(int))


Listener = Callable[[Envelope], None]


class SimBus:
    """The Publisher port: latency, duplication, reordering, redelivery of failed handlers."""

    def __init__(self, env: simpy.Environment, cfg: BusCfg, rng: np.random.Generator,
                 clock: SimClock, *, record: bool = False) -> None:
        self.env = env
        self.cfg = cfg
        self.rng = rng
        self.clock = clock
        self.deps: Deps | None = None
        self.listeners: list[Listener] = []
        self.rows: list[dict[str, Any]] = []  # the event log: type, time, data (+ id, source)
        self.stats = BusStats()
        # (time, envelope, services, api call): what was delivered, for replays (bench)
        self.record: list[tuple[float, Envelope | None, tuple[str, ...] | None, Any]] | None = (
            [] if record else None)
        self._seen: set[str] = set()
        self.errors: dict[str, int] = defaultdict(int)  # handler exceptions, by message
        self._fixed_latency = cfg.latency.kind == "fixed"

    def publish(self, envelope: Envelope) -> None:
        self.stats.published += 1
        cfg = self.cfg
        delay = cfg.latency.a if self._fixed_latency else cfg.latency.sample(self.rng)
        if cfg.reorder and self.rng.random() < cfg.reorder:
            delay += cfg.reorder_delay.sample(self.rng)
            self.stats.reordered += 1
        call_later(self.env, delay, self._deliver, envelope, None, 1)
        if cfg.duplicate and self.rng.random() < cfg.duplicate:
            self.stats.duplicates += 1
            call_later(self.env, delay + cfg.latency.sample(self.rng), self._deliver, envelope,
                       None, 1)

    def emit(self, event: Event, source: str) -> Envelope:
        """Publish an event from outside any transaction (compute, agents, operators)."""
        envelope = make_envelope(event, source, self.clock.now())
        self.publish(envelope)
        return envelope

    def _deliver(self, envelope: Envelope, services: tuple[str, ...] | None, n: int) -> None:
        deps = self.deps
        assert deps is not None, "SimBus.deps must be set before the simulation runs"
        if self.record is not None:
            self.record.append((float(self.env.now), envelope, services, None))
        stats = self.stats
        failed: list[str] = []
        for service, handler in subscribers(envelope.type):
            if services is not None and service not in services:
                continue
            t0 = time.perf_counter()
            try:
                outcome = run_handler(service, handler, envelope, deps)
            except PermanentError:  # pragma: no cover - run_handler dead-letters these
                outcome = Outcome.DEAD_LETTERED
            except Exception as exc:  # transient: Pub/Sub redelivers to this subscription
                failed.append(service)
                outcome = None
                self.errors[f"{service}: {type(exc).__name__}: {exc}"[:200]] += 1
            stats.handler_s[service] += time.perf_counter() - t0
            if outcome is not None:
                stats.outcomes[outcome.value] += 1
        if failed:
            if n < self.cfg.max_deliveries:
                stats.retries += 1
                call_later(self.env, self.cfg.retry_delay_s * 2 ** (n - 1), self._deliver,
                           envelope, tuple(failed), n + 1)
            else:
                stats.gave_up += 1
                log.warning("gave up delivering %s to %s after %d attempts", envelope.type,
                            ",".join(failed), n)
        if services is not None or envelope.id in self._seen:
            return
        self._seen.add(envelope.id)
        stats.delivered += 1
        stats.by_type[envelope.type] += 1
        self.rows.append({"type": envelope.type, "time": envelope.time,
                          "data": envelope.event.to_dict(), "id": envelope.id,
                          "source": envelope.source, "delivered_at": self.clock.now()})
        for listener in self.listeners:
            listener(envelope)


# ---------------------------------------------------------------- the fleet's truth


@dataclass
class SimNode:
    node_id: str
    partition: str
    index: int
    multiplier: float
    up: bool = False
    deleted: bool = False
    fault: Fault | None = None
    straggle: float = 1.0  # speed ratio while straggling
    life_token: int = 0
    verify_token: int = 0
    attempt: Attempt | None = None
    replacement: bool = False


@dataclass
class JobTruth:
    """What really happened to one job, second by second (the analytic model's ledger)."""

    kept_compute_s: float = 0.0  # compute wall time whose progress was kept
    kept_work_s: float = 0.0  # the same at nominal speed (steps x step time)
    wasted_s: float = 0.0  # compute since the last checkpoint, lost (partial saves included)
    save_s: float = 0.0  # blocking checkpoint saves that completed
    startup_s: float = 0.0
    restore_s: float = 0.0
    attempts: int = 0
    failed_launches: int = 0
    interruptions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    slowdown_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass
class SimJob:
    cfg: JobCfg
    job_id: str
    ckpt_step: int = -1  # newest complete checkpoint (the program's own storage)
    ckpt_at: float = 0.0
    emitted_step: int = -1
    steps_done: int = 0
    finished: bool = False
    attempt: Attempt | None = None
    truth: JobTruth = field(default_factory=JobTruth)


@dataclass
class Attempt:
    job: SimJob
    number: int
    node_ids: tuple[str, ...]
    start: float
    ready: float
    base_step: int  # steps already in the checkpoint it resumed from (0 from scratch)
    alive: bool = True
    stopped_at: float | None = None  # progress stopped here (death, SIGTERM, exit)
    exited: bool = False
    token: int = 0
    factors: list[tuple[float, float]] = field(default_factory=list)  # (from t, straggle)
    counted: int = 0  # periodic checkpoints already accounted
    work_at_ckpt: float = 0.0  # nominal work in the counted checkpoints
    plain_at_ckpt: float = 0.0  # the same without straggler slowdown
    cause: str = ""


class SimCompute:
    """The Compute port over a simulated fleet (see the module docstring)."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, bus: SimBus,
                 model: FailureModel, rng: np.random.Generator, *,
                 return_after_passes: int, heartbeat_timeout_s: float) -> None:
        self.env = env
        self.sc = scenario
        self.bus = bus
        self.model = model
        self.rng = rng
        self.return_after_passes = return_after_passes
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.nodes: dict[str, SimNode] = {}
        self.by_partition: dict[str, list[str]] = defaultdict(list)
        self.jobs: dict[str, SimJob] = {}
        self.stragglers: dict[str, float] = {}
        self._provisioning: set[str] = set()
        self._repairs: set[tuple[str, int]] = set()
        self._attempts: set[tuple[str, int]] = set()
        self.cordoned: set[str] = set()
        self.failures: dict[str, int] = defaultdict(int)  # root faults by cause (every node)
        self.repairs_done: dict[str, int] = defaultdict(int)
        self.planned = 0
        self.timeline: list[tuple[float, str, str, str]] = []  # (t, kind, node/job, detail)
        self.calls = 0
        self.horizon = math.inf
        self.failing = False  # node faults start with the run, not during bring-up
        bus.listeners.append(self._observe)

    # -- helpers
    def emit(self, event: Event, source: str = COMPUTE_SOURCE) -> None:
        self.bus.emit(event, source)

    def add_job(self, cfg: JobCfg) -> SimJob:
        job = SimJob(cfg, cfg.name)
        self.jobs[job.job_id] = job
        return job

    def _observe(self, envelope: Envelope) -> None:
        """The agent stops its post-repair checks once the control plane has decided."""
        event = envelope.event
        if isinstance(event, NodeReturnedToService | NodeRepairStarted | NodeRetired):
            node = self.nodes.get(event.node_id)
            if node is not None:
                node.verify_token += 1

    # ---------------------------------------------------------------- Compute port
    def provision_node(self, node: Node) -> None:
        self.calls += 1
        if node.node_id in self._provisioning or node.node_id in self.nodes:
            return
        self._provisioning.add(node.node_id)
        replacement = node.replaces is not None
        if replacement:
            took = self.sc.repair.durations["replace"].sample(self.rng)
        else:
            took = self.sc.cluster.provision.sample(self.rng)
        call_later(self.env, took, self._provisioned, node.node_id, node.partition,
                   node.role is NodeRole.WORKER, replacement)

    def _provisioned(self, node_id: str, partition: str, worker: bool, replacement: bool) -> None:
        index = len(self.by_partition[partition])
        node = SimNode(node_id, partition, index,
                       self.model.node_multiplier(replacement=replacement), up=True,
                       replacement=replacement)
        self.nodes[node_id] = node
        self._provisioning.discard(node_id)
        self.emit(NodeProvisioned(node_id=node_id))
        if not worker:
            return
        self.by_partition[partition].append(node_id)
        if replacement:
            self.repairs_done["replace"] += 1
            self.timeline.append((float(self.env.now), "replaced", node_id, ""))
        if self.failing:
            self._renew_life(node)
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
        node.life_token += 1
        node.verify_token += 1
        self.stragglers.pop(node_id, None)
        if node.attempt is not None and node.attempt.alive:
            self._kill(node.attempt, float(self.env.now), "node deleted", hang=False)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        self.calls += 1
        key = (node_id, attempt)
        if key in self._repairs:
            return
        self._repairs.add(key)
        node = self.nodes.get(node_id)
        if node is None:
            return
        node.verify_token += 1
        took = self.sc.repair.durations[action.value].sample(self.rng)
        self.timeline.append((float(self.env.now), "repair", node_id, action.value))
        call_later(self.env, took, self._repaired, node, action, attempt)

    def _repaired(self, node: SimNode, action: RepairAction, attempt: int) -> None:
        if node.deleted:
            return
        mech_ok = self.rng.random() >= self.sc.repair.mechanical_failure.get(action.value, 0.0)
        fault = node.fault
        fixes = fault is None or repair_fixes(action, fault.fix)
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
                if self.failing:
                    self._renew_life(node)
        self.emit(NodeRepairCompleted(node_id=node.node_id, action=action.value,
                                      attempt=attempt, ok=ok, detail=detail))
        if ok:
            self._verify(node)

    def start_workers(self, workers: Sequence[WorkerSpec]) -> None:
        self.calls += 1
        if not workers:
            return
        first = workers[0]
        key = (first.job_id, first.attempt)
        if key in self._attempts:
            return
        self._attempts.add(key)
        job = self.jobs.get(first.job_id)
        if job is None:
            return
        now = float(self.env.now)
        cfg = job.cfg
        node_ids = tuple(w.node_id for w in sorted(workers, key=lambda w: w.rank))
        resume = job.ckpt_step >= 0
        startup = cfg.startup_s
        restore = cfg.checkpoint_restore_s if resume else 0.0
        att = Attempt(job, first.attempt, node_ids, now, now + startup + restore,
                      max(job.ckpt_step, 0))
        job.attempt = att
        job.truth.attempts += 1
        broken: list[tuple[str, Fault | None]] = []
        for nid in node_ids:
            node = self.nodes.get(nid)
            if node is None or node.deleted or not node.up:
                broken.append((nid, None))
                continue
            if node.attempt is not None and node.attempt.alive and node.attempt is not att:
                self._kill(node.attempt, now, "node taken by another attempt", hang=False)
            node.attempt = att
            if node.fault is not None and node.fault.signal.blocks_launch:
                broken.append((nid, node.fault))
        factor = 1.0
        if self.stragglers:
            members = set(node_ids)
            factor = min((r for n, r in self.stragglers.items() if n in members), default=1.0)
        att.factors.append((now, factor))
        if broken:
            job.truth.failed_launches += 1
            fail_at = min(cfg.launch_fail_s, startup)
            att.cause = broken[0][1].cause.name if broken[0][1] is not None else "node_missing"
            call_later(self.env, fail_at, self._launch_failed, att, broken)
            return
        if cfg.work_s is not None:
            self._plan_completion(att)
        if self.sc.checkpoint_events == "all":
            call_later(self.env, att.ready + cfg.checkpoint_interval_s + cfg.checkpoint_save_s
                       - now, self._periodic_checkpoint, att, att.token)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        self.calls += 1
        job = self.jobs.get(job_id)
        att = job.attempt if job is not None else None
        if att is None or att.number != attempt or att.exited:
            return
        now = float(self.env.now)
        if not att.alive:  # crashed already: nothing to save, exit at once
            self._exit(att, EXIT_CRASH, f"cause={att.cause} crashed_at="
                                        f"{EPOCH_S + (att.stopped_at or now):.3f}")
            return
        if att.stopped_at is not None:
            return  # already saving on an earlier SIGTERM
        cfg = att.job.cfg
        att.stopped_at = now
        att.token += 1
        if now < att.ready:  # nothing new since the checkpoint it resumes from
            att.alive = False
            self._settle(att, now, saved=False)
            self._exit(att, EXIT_PREEMPTED, "stopped during startup")
            return
        cycle = cfg.checkpoint_interval_s + cfg.checkpoint_save_s
        into = (now - att.ready) % cycle
        if into >= cfg.checkpoint_interval_s:  # a periodic save is under way: let it finish
            done_at = now + (cycle - into)
            if done_at - now <= grace_s:
                att.stopped_at = done_at
                call_later(self.env, done_at - now, self._graceful, att, done_at, False)
                return
        elif cfg.checkpoint_save_s <= grace_s:
            call_later(self.env, cfg.checkpoint_save_s, self._graceful, att, now, True)
            return
        call_later(self.env, grace_s, self._sigkill, att)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self.calls += 1
        job = self.jobs.get(job_id)
        att = job.attempt if job is not None else None
        if att is None or att.number != attempt or att.exited:
            return
        now = float(self.env.now)
        if att.alive:
            att.alive = False
            att.stopped_at = att.stopped_at if att.stopped_at is not None else now
            self._settle(att, att.stopped_at, saved=False)
        self._exit(att, EXIT_KILLED, "stopped")

    # ---------------------------------------------------------------- job model
    def _cycle(self, att: Attempt) -> tuple[float, float]:
        cfg = att.job.cfg
        return cfg.checkpoint_interval_s, cfg.checkpoint_save_s

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
        step = att.base_step + int(work / job.cfg.step_time_s + 1e-9)
        if step > job.ckpt_step:
            job.ckpt_step = step
            job.ckpt_at = at

    def _settle(self, att: Attempt, t: float, *, saved: bool) -> None:
        """Progress stops at ``t``: split the attempt's time into the truth ledger."""
        cfg = att.job.cfg
        truth = att.job.truth
        startup_end = att.start + cfg.startup_s
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

    def _graceful(self, att: Attempt, stopped: float, save_now: bool) -> None:
        if att.exited or not att.alive:
            return
        self._settle(att, stopped, saved=save_now)
        att.alive = False
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
                self._report_fault(self.nodes[nid], fault, now)
        self._exit(att, EXIT_CRASH, f"cause={att.cause} crashed_at={EPOCH_S + now:.3f} "
                                    f"launch failed on {broken[0][0]}")

    def _exit(self, att: Attempt, code: int, detail: str) -> None:
        if att.exited:
            return
        att.exited = True
        att.token += 1
        job = att.job
        for nid in att.node_ids:
            node = self.nodes.get(nid)
            if node is not None and node.attempt is att:
                node.attempt = None
        if job.ckpt_step > job.emitted_step:
            self._emit_checkpoint(job, att.number)
        if code == EXIT_OK:
            job.finished = True
        self.emit(JobWorkersExited(job_id=job.job_id, attempt=att.number, exit_code=code,
                                   detail=detail))

    def _emit_checkpoint(self, job: SimJob, attempt: int) -> None:
        job.emitted_step = job.ckpt_step
        self.emit(JobCheckpointSaved(job_id=job.job_id, attempt=attempt, step=job.ckpt_step,
                                     path=f"sim://{job.job_id}/checkpoints/"
                                          f"ckpt-{job.ckpt_step:08d}",
                                     saved_at=EPOCH_S + job.ckpt_at))

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
        save = att.job.cfg.checkpoint_save_s
        call_later(self.env, save, self._exit, att, EXIT_OK, "training finished")

    # ---------------------------------------------------------------- failures
    def _renew_life(self, node: SimNode) -> None:
        node.life_token += 1
        life = self.model.lifetime_s(node.multiplier)
        if math.isfinite(life) and float(self.env.now) + life < self.horizon:
            call_later(self.env, life, self._fail, node, node.life_token)

    def _fail(self, node: SimNode, token: int) -> None:
        if token != node.life_token or node.deleted or not node.up or node.fault is not None:
            return
        now = float(self.env.now)
        fault = self.model.fault(now)
        victims = [node]
        if fault.group > 1:
            peers = self.by_partition[node.partition]
            start = (node.index // fault.group) * fault.group
            for nid in peers[start:start + fault.group]:
                peer = self.nodes[nid]
                if peer is not node and peer.up and not peer.deleted and peer.fault is None:
                    victims.append(peer)
        for victim in victims:
            self.apply_fault(victim, fault)

    def apply_fault(self, node: SimNode, fault: Fault) -> None:
        now = float(self.env.now)
        cause = fault.cause
        self.failures[cause.name] += 1
        self.timeline.append((now, "fault", node.node_id, cause.name))
        node.life_token += 1
        att = node.attempt
        if att is not None and att.alive and not att.exited and cause.kills_job:
            att.job.truth.interruptions[cause.name] += 1
            self._kill(att, now, cause.name, hang=cause.hang or fault.signal.node_down)
        if fault.fix == "none":
            if self.failing:
                self._renew_life(node)  # transient: nothing on the node to repair
        else:
            node.fault = fault
        if not fault.signal.empty:
            self._report_fault(node, fault, now)

    def _report_fault(self, node: SimNode, fault: Fault, now: float) -> None:
        signal = fault.signal
        delay = self.sc.detection[signal.detection].sample(self.rng)
        if signal.heartbeat:
            delay += self.heartbeat_timeout_s
        call_later(self.env, delay, self._send_fault_report, node, fault, now)

    def _send_fault_report(self, node: SimNode, fault: Fault, fault_at: float) -> None:
        if node.deleted or (node.fault is not fault and fault.fix != "none"):
            return  # repaired (or replaced) before anyone noticed
        observed = EPOCH_S + float(self.env.now)
        source = "heartbeat-monitor" if fault.signal.heartbeat else "agent"
        self.emit(NodeHealthReported(
            node_id=node.node_id, observed_at=observed,
            conditions=fault_conditions(fault.signal, EPOCH_S + fault_at, observed,
                                        fault.cause.name),
            source=source), AGENT_SOURCE)

    def _verify(self, node: SimNode) -> None:
        """Post-provision / post-repair checks: the agent reports until the node is back."""
        node.verify_token += 1
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
        self.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                     conditions=healthy_conditions(observed),
                                     source="post-repair-check"), AGENT_SOURCE)
        if n < self.return_after_passes + 3:
            call_later(self.env, self.sc.repair.verify_interval_s, self._verify_report, node,
                       token, n + 1)

    def start_failures(self) -> None:
        """Start every node's failure clock (bring-up is taken as failure-free)."""
        self.failing = True
        for node in self.nodes.values():
            if node.up and not node.deleted and node.partition:
                self._renew_life(node)

    # -- stragglers
    def start_stragglers(self) -> None:
        cfg = self.sc.failures.stragglers
        if cfg.rate_per_node_day > 0:
            self._next_straggler()

    def _next_straggler(self) -> None:
        cfg = self.sc.failures.stragglers
        up = max(1, len(self.nodes))
        rate_per_s = cfg.rate_per_node_day * up / 86_400.0
        call_later(self.env, float(self.rng.exponential(1.0 / rate_per_s)), self._straggle)

    def _straggle(self) -> None:
        cfg = self.sc.failures.stragglers
        self._next_straggler()
        candidates = [n for n in self.nodes.values()
                      if n.up and not n.deleted and n.node_id not in self.stragglers
                      and n.partition]
        if not candidates:
            return
        node = candidates[int(self.rng.integers(len(candidates)))]
        ratio = min(0.99, cfg.ratio.sample(self.rng))
        self.stragglers[node.node_id] = ratio
        node.straggle = ratio
        self.timeline.append((float(self.env.now), "straggler", node.node_id, f"{ratio:.2f}"))
        self._refactor(node)
        until = float(self.env.now) + cfg.duration.sample(self.rng)
        delay = self.sc.detection["speed"].sample(self.rng)
        call_later(self.env, delay, self._straggle_report, node, ratio, until)
        call_later(self.env, until - float(self.env.now), self._straggle_end, node, ratio)

    def _straggle_report(self, node: SimNode, ratio: float, until: float) -> None:
        if self.stragglers.get(node.node_id) != ratio or node.deleted:
            return
        observed = EPOCH_S + float(self.env.now)
        cond = {"type": "SlowSpeedCheck", "status": "true", "reason": "slow speed check",
                "since": observed, "details": {"ratio_to_baseline": ratio,
                                               "cause": "straggler"}}
        self.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                     conditions=(cond,)), AGENT_SOURCE)
        nxt = self.sc.failures.stragglers.report_interval_s
        if float(self.env.now) + nxt < until:
            call_later(self.env, nxt, self._straggle_report, node, ratio, until)

    def _straggle_end(self, node: SimNode, ratio: float) -> None:
        if self.stragglers.get(node.node_id) == ratio:
            del self.stragglers[node.node_id]
            node.straggle = 1.0
            self._refactor(node)

    def _refactor(self, node: SimNode) -> None:
        att = node.attempt
        if att is None or not att.alive or att.stopped_at is not None:
            return
        members = set(att.node_ids)
        factor = min((r for n, r in self.stragglers.items() if n in members), default=1.0)
        if att.factors and att.factors[-1][1] == factor:
            return
        att.factors.append((float(self.env.now), factor))
        if att.job.cfg.work_s is not None:
            att.token += 1
            self._plan_completion(att)
            if self.sc.checkpoint_events == "all":
                self._rearm_checkpoints(att)

    def _rearm_checkpoints(self, att: Attempt) -> None:
        interval, save = self._cycle(att)
        cycle = interval + save
        now = float(self.env.now)
        k = max(1, math.ceil((now - att.ready) / cycle))
        call_later(self.env, att.ready + k * cycle - now, self._periodic_checkpoint, att,
                   att.token)

    # -- planned maintenance
    def start_planned(self) -> None:
        if self.sc.failures.planned.rate_per_day > 0:
            self._next_planned()

    def _next_planned(self) -> None:
        cfg = self.sc.failures.planned
        mean = 86_400.0 / cfg.rate_per_day
        gap = mean if cfg.periodic else float(self.rng.exponential(mean))
        call_later(self.env, gap, self._planned)

    def _planned(self) -> None:
        self._next_planned()
        for job in self.jobs.values():
            att = job.attempt
            if att is None or not att.alive or att.exited or att.stopped_at is not None:
                continue
            self.planned += 1
            job.truth.interruptions["planned_maintenance"] += 1
            self.timeline.append((float(self.env.now), "planned", job.job_id, ""))
            self.emit(JobInterruptRequested(job_id=job.job_id, attempt=att.number,
                                            node_id=att.node_ids[0],
                                            reason="planned_maintenance: scheduled restart"),
                      OPERATOR_SOURCE)

    # -- the end
    def finish(self) -> None:
        """At the horizon: account the attempts still running (their progress is not lost)."""
        now = float(self.env.now)
        for job in self.jobs.values():
            att = job.attempt
            if att is not None and att.alive and not att.exited and att.stopped_at is None:
                att.stopped_at = now
                self._settle(att, now, saved=False)
