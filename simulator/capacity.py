"""The availability mode at run time (its configuration: :mod:`simulator.availability`).

Spot preemptions with notice, queue waits before capacity arrives, and the node-hour meter,
acting on the twin's fleet (:class:`~simulator.fleet.Fleet`) and, when a VM goes, on the job
model (whatever still ran there dies). A spot node gets
a ``PreemptionNotice`` health report from its agent ``detect`` after the notice (the real
triage table maps it to drain-and-replace: the job checkpoints in its grace period and moves),
and ``notice`` after it the VM is gone, whatever still runs on it dying with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from shared.domain.events import NodeHealthReported
from shared.domain.health import ConditionStatus, ConditionType
from simulator.availability import AvailabilityCfg
from simulator.clock import EPOCH_S, call_later
from simulator.failures import Cause, Fault, Signal, Variant
from simulator.fleet import Fleet
from simulator.jobs import JobModel
from simulator.world import AGENT_SOURCE, SimNode

PREEMPTION = "spot_preemption"  # the cause the accounting ties the lost time to
STREAM_KEY = 0xA7A1  # the SeedSequence spawn key of the availability's random stream


def rng_for(seed: int) -> np.random.Generator:
    """The availability's own stream: independent of the failure, compute and bus streams."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(STREAM_KEY,)))


_GONE = Cause(name=PREEMPTION, label="spot preemption", category="availability",
              rate_per_node_day=0.0,
              variants=(Variant(1.0, Signal(heartbeat=True), (("replace", 1.0),), 1),),
              kills_job=True, hang=True)


@dataclass
class Meter:
    """Node-hours billed: [start, stop) per VM, in simulated seconds."""

    spans: dict[str, list[float]] = field(default_factory=dict)

    def start(self, node_id: str, t: float) -> None:
        self.spans.setdefault(node_id, [t, math.inf])

    def stop(self, node_id: str, t: float) -> None:
        span = self.spans.get(node_id)
        if span is not None and span[1] == math.inf:
            span[1] = max(span[0], t)

    def node_hours(self, end: float) -> float:
        return sum(max(0.0, min(stop, end) - start) for start, stop in self.spans.values()
                   if start < end) / 3600.0


class Capacity:
    """The availability mode at run time, acting on the simulated compute (see the module)."""

    def __init__(self, env: simpy.Environment, cfg: AvailabilityCfg,
                 rng: np.random.Generator) -> None:
        self.env = env
        self.cfg = cfg
        self.rng = rng
        self.meter = Meter()
        self.fleet: Fleet | None = None  # (from ``start``: the run's)
        self.job_model: JobModel | None = None
        self.preempted: set[str] = set()  # nodes whose VM got a notice
        self.counts: dict[str, int] = {"preemptions": 0, "with_job": 0, "job_lost_progress": 0}
        self.queue_wait_s: list[float] = []
        self._first_wait: float | None = None
        self.running = False

    # -- provisioning (simulator.machines)
    def arrival_wait(self, replaces: str | None) -> float:
        """Seconds before a requested VM exists: the queue (one grant for the whole first
        request, a wait per replacement)."""
        if self.cfg.mode != "queued":
            return 0.0
        if replaces is None:
            if self._first_wait is None:
                self._first_wait = self.cfg.queued.wait.sample(self.rng)
                self.queue_wait_s.append(self._first_wait)
            return self._first_wait
        if not self.cfg.queued.replacements:
            return 0.0
        wait = self.cfg.queued.wait.sample(self.rng)
        self.queue_wait_s.append(wait)
        return wait

    def replacement_time(self, replaces: str | None) -> float | None:
        """How long a new VM for a preempted one takes (None: the scenario's replace time)."""
        if replaces is not None and replaces in self.preempted:
            return self.cfg.spot.obtain.sample(self.rng)
        return None

    # -- spot preemptions
    def start(self, fleet: Fleet, job_model: JobModel) -> None:
        """Start every node's preemption clock (with the failure clocks, at READY)."""
        self.fleet = fleet
        self.job_model = job_model
        self.running = True
        for node in list(fleet.nodes.values()):
            self.arm(node)

    def arm(self, node: SimNode) -> None:
        rate = self.cfg.spot.preemptions_per_node_day
        if not self.running or self.cfg.mode != "spot" or rate <= 0 or not node.partition:
            return
        gap = float(self.rng.exponential(86_400.0 / rate))
        assert self.fleet is not None
        if float(self.env.now) + gap < self.fleet.horizon:
            call_later(self.env, gap, self._notice, node)

    def _notice(self, node: SimNode) -> None:
        if node.deleted or not node.up or node.node_id in self.preempted:
            return
        fleet = self.fleet
        assert fleet is not None
        now = float(self.env.now)
        self.preempted.add(node.node_id)
        self.counts["preemptions"] += 1
        fleet.timeline.append((now, "preempted", node.node_id, ""))
        att = node.attempt
        if att is not None and att.alive and not att.exited:
            self.counts["with_job"] += 1
            att.job.truth.interruptions[PREEMPTION] += 1
        notice = self.cfg.spot.notice_s
        call_later(self.env, self.cfg.spot.detect_s, self._report, node, now)
        call_later(self.env, notice, self._gone, node)

    def _report(self, node: SimNode, at: float) -> None:
        assert self.fleet is not None
        if node.deleted:
            return
        observed = EPOCH_S + float(self.env.now)
        cond = {"type": ConditionType.PREEMPTION_NOTICE.value,
                "status": ConditionStatus.TRUE.value, "reason": "spot VM preemption notice",
                "since": EPOCH_S + at,
                "details": {"notice_s": self.cfg.spot.notice_s, "kind": "spot",
                            "cause": PREEMPTION}}
        self.fleet.emit(NodeHealthReported(node_id=node.node_id, observed_at=observed,
                                           conditions=(cond,)), AGENT_SOURCE)

    def _gone(self, node: SimNode) -> None:
        """The notice ran out: the VM stops, whatever is still on it dies."""
        fleet, job_model = self.fleet, self.job_model
        assert fleet is not None and job_model is not None
        now = float(self.env.now)
        self.meter.stop(node.node_id, now)
        if node.deleted:
            return
        node.up = False
        node.life_token += 1
        node.fault = Fault(cause=_GONE, signal=_GONE.variants[0].signal, fix="replace", at=now)
        fleet.fitness_changed(node)
        att = node.attempt
        if att is not None and att.alive and not att.exited:
            self.counts["job_lost_progress"] += 1
            job_model.kill(att, now, PREEMPTION, hang=True)

    def summary(self) -> dict[str, Any]:
        return {"mode": self.cfg.mode, **self.counts,
                "queue_wait_h": sum(self.queue_wait_s) / 3600.0,
                "queue_waits": len(self.queue_wait_s)}

