"""The digital twin: the real control plane, wired by ``services.wiring.embedded.build_deps`` to the
simulation adapters, driving a simulated fleet for a simulated horizon.

How one run goes (all on SimPy time; nothing sleeps):

1. ``create_cluster`` is called through the real job-submission API in a unit of work; the
   provisioning handlers ask :class:`~simulator.compute.SimCompute` for every node, which
   answers ``NodeProvisioned`` after a sampled boot time and then reports healthy checks until
   health triage returns the node to service. The cluster becomes READY through the real
   ``step_mark_ready``.
2. The scenario's jobs are submitted through the real API when the cluster is ready (plus
   their ``submit_at``); the scheduler gang-places them and calls ``start_workers``.
3. Node faults, stragglers and planned restarts arrive from the failure model; each produces
   health reports (or a job crash, or an operator's interrupt request) and the real handlers
   decide: triage, drain, checkpoint-and-requeue, the repair ladder, the blast-radius guard.
4. At the horizon (the cluster's ready time + ``duration``) the run stops; the goodput is
   accounted from the event log (``simulator.goodput``) and checked against the job model's
   own ledger.

``run(scenario, seed=...)`` returns a :class:`RunResult`; the same scenario and seed give the
same ``summary()`` on any machine.
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from services.wiring.builder import build_deps
from services.wiring.routes import control_plane_routes
from shared.adapters.docstore import prune_expired
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.outbox import DocOutbox
from shared.config import ControlPlaneConfig
from shared.domain.events import ClusterReady, Envelope, JobFinished
from shared.handling import Deps, run_command
from shared.policies.recovery import MIN_REPLICAS_LABEL, MODE_LABEL, Tier
from shared.policies.repair import load_repair_config
from shared.policies.rollout import ROLLOUTS
from shared.policies.triage import load_triage_table
from simulator import goodput, preflight_model, rollout_model, team_queues
from simulator.bus import SimBus
from simulator.capacity import Capacity
from simulator.capacity import rng_for as availability_rng
from simulator.clock import EPOCH_S, SimClock, call_later
from simulator.compute import SimCompute
from simulator.cost import CostInputs, cost_summary
from simulator.failures import FailureModel
from simulator.scenario import Scenario
from simulator.scenario_types import PartitionCfg

SIM_SOURCE = "//mtc/sim/control-plane"
MAX_BRINGUP_S = 30 * 86_400.0  # a cluster that is not ready after this is a failed run


class TwinError(RuntimeError):
    """The simulated control plane did not get where it had to (e.g. the cluster never
    became ready)."""


def control_plane_config(scenario: Scenario, base: ControlPlaneConfig | None = None
                         ) -> ControlPlaneConfig:
    """The ControlPlaneConfig the scenario asks for (``base`` for what it does not set)."""
    cp = scenario.control_plane
    config = base or ControlPlaneConfig()
    if cp.triage_table is not None:
        config = replace(config, triage_table=load_triage_table(Path(cp.triage_table)))
    if cp.repair:
        config = replace(config, repair=load_repair_config(cp.repair))
    # the twin sends no FleetTicked, and the tick is what starts a job whose restart backoff
    # has passed (and runs the progress watchdog): with a backoff a requeued job would wait
    # for an unrelated event, so the twin restarts at once, as it did before the backoff
    restart = replace(config.restart, backoff_base_s=0.0)
    return replace(config, grace_period_s=cp.grace_period_s,
                   heartbeat_timeout_s=cp.heartbeat_timeout_s,
                   max_event_age_s=cp.max_event_age_s, backfill=cp.backfill, restart=restart)


def cluster_body(scenario: Scenario) -> dict[str, Any]:
    c = scenario.cluster
    machine = {"machineType": c.machine_type, "acceleratorType": c.accelerator,
               "acceleratorCount": c.gpus_per_node}
    return {
        "clusterId": c.cluster_id,
        "nodePools": [{"id": p.name, "machineSpec": machine, "nodeCount": p.nodes,
                       "spareCount": p.spares, **_topology(p)} for p in c.partitions],
        "partitions": [{"name": p.name, "nodePoolIds": [p.name]} for p in c.partitions],
        **({"labels": preflight_model.labels(c.preflight)} if c.preflight.mode != "off" else {}),
        **({"queues": team_queues.cluster_queues(c.queues)} if c.queues else {}),
    }


def _topology(p: PartitionCfg) -> dict[str, Any]:
    """A partition with racks: its pool's topology (absent: the body is what it was)."""
    if not p.nodes_per_rack:
        return {}
    return {"topology": {"nodesPerRack": p.nodes_per_rack, "spareLayout": p.spare_layout}}


def job_body(scenario: Scenario, index: int) -> dict[str, Any]:
    c = scenario.cluster
    j = scenario.jobs[index]
    body: dict[str, Any] = {
        "displayName": j.name,
        "jobSpec": {
            "workerPoolSpecs": [{
                "machineSpec": {"machineType": c.machine_type, "acceleratorType": c.accelerator,
                                "acceleratorCount": c.gpus_per_node},
                "replicaCount": j.nodes,
                "containerSpec": {"imageUri": "sim", "command": ["train"]},
            }],
            "scheduling": {"restartJobOnWorkerRestart": True, "partition": j.partition,
                           "priority": j.priority, "maxRestarts": j.max_restarts},
            "baseOutputDirectory": {"outputUriPrefix": f"sim://{j.name}"},
        },
    }
    labels = team_queues.job_labels(j)  # its team's queue (absent: the default queue)
    rec = scenario.recovery
    if rec is not None:  # the job's recovery knobs, as the SDK sets them (labels)
        if rec.pinned is not None:
            labels[MODE_LABEL] = rec.pinned
        if rec.min_replicas is not None:
            labels[MIN_REPLICAS_LABEL] = str(rec.min_replicas)
    if labels:
        body["labels"] = labels
    return body


@dataclass
class Timings:
    wall_s: float = 0.0
    bringup_s: float = 0.0
    handlers_s: float = 0.0
    accounting_s: float = 0.0
    by_service: dict[str, float] = field(default_factory=dict)

    @property
    def twin_s(self) -> float:
        """Everything but the handlers and the accounting: SimPy, compute, bus, failures."""
        return max(0.0, self.wall_s - self.handlers_s - self.accounting_s)


@dataclass
class RunResult:
    scenario: Scenario
    seed: int
    ready_at: float  # simulated seconds from the create request to READY
    horizon: float  # simulated seconds at the end of the run
    accounting: goodput.Accounting
    truth: dict[str, Any]
    failures: dict[str, int]
    interruptions: dict[str, int]
    repairs: dict[str, int]
    restarts: dict[str, int]
    job_states: dict[str, str]
    bus: dict[str, Any]
    dead_letters: int
    timings: Timings
    timeline: list[tuple[float, str, str, str]]
    rows: list[dict[str, Any]] = field(repr=False)
    # the availability mode's counts and the cost per useful GPU-hour (simulator.cost)
    cost: dict[str, Any] = field(default_factory=dict)
    # the scenario's software rollout, as it ended (simulator.rollout_model); None: none
    rollout: dict[str, Any] | None = None

    @property
    def events(self) -> int:
        return int(self.bus["delivered"])

    def job(self, name: str | None = None) -> goodput.JobGoodput:
        return self.accounting.jobs[name or self.scenario.jobs[0].name]

    def summary(self) -> dict[str, Any]:
        """Everything a run measured, without wall-clock timings: equal for equal seeds."""
        out: dict[str, Any] = {
            "scenario": self.scenario.name,
            "seed": self.seed,
            "ready_at_s": round(self.ready_at, 6),
            "events": self.events,
            "failures": dict(sorted(self.failures.items())),
            "interruptions": dict(sorted(self.interruptions.items())),
            "repairs": dict(sorted(self.repairs.items())),
            "restarts": dict(sorted(self.restarts.items())),
            "job_states": dict(sorted(self.job_states.items())),
            "dead_letters": self.dead_letters,
            "handler_errors": dict(sorted(self.bus.get("errors", {}).items())),
            "fleet": _rounded(self.accounting.fleet.as_dict()),
        }
        for name, jg in sorted(self.accounting.jobs.items()):
            out[f"job:{name}"] = _rounded(jg.as_dict())
        if self.scenario.availability.explicit:  # (left out otherwise: goldens unchanged)
            out["cost"] = _rounded(self.cost)
        if self.rollout is not None:
            out["rollout"] = self.rollout
        return out


def _rounded(data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, float):
            out[key] = round(value, 6)
        elif isinstance(value, Mapping):
            out[key] = _rounded(value)
        else:
            out[key] = value
    return out


class Twin:
    """One simulated world: SimPy environment, adapters, the real control plane."""

    def __init__(self, scenario: Scenario, *, seed: int | None = None,
                 config: ControlPlaneConfig | None = None, store: Any = None,
                 record: bool = False) -> None:
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.env = simpy.Environment()
        streams = np.random.SeedSequence(self.seed).spawn(4)
        rng_fail, rng_compute, rng_bus, _spare = (np.random.default_rng(s) for s in streams)
        self.clock = SimClock(self.env, EPOCH_S)
        self.bus = SimBus(self.env, scenario.bus, rng_bus, self.clock, control_plane_routes(),
                          record=record)
        self.config = config if config is not None else control_plane_config(scenario)
        self.model = FailureModel(scenario.failures, rng_fail)
        self.compute = SimCompute(self.env, scenario, self.bus, self.model, rng_compute,
                                  return_after_passes=self.config.repair.return_after_passes,
                                  heartbeat_timeout_s=self.config.heartbeat_timeout_s,
                                  capacity=Capacity(self.env, scenario.availability,
                                                    availability_rng(self.seed)))
        self.fleet = self.compute.fleet  # the simulated world's state, read for the result
        self.store = store if store is not None else MemoryDocStore()
        self.deps: Deps = build_deps(self.store, clock=self.clock, compute=self.compute,
                                     publisher=self.bus, config=self.config, source=SIM_SOURCE,
                                     with_event_log=False, outbox=DocOutbox(self.store),
                                     pooled=True)
        self.bus.deps = self.deps
        self.bus.on_prune = self._prune_idempotency
        self._bus_prunes = 0
        self.api_calls: list[tuple[float, Callable[[Any, Deps], Any]]] = []
        self.ready_at: float | None = None
        self._ready = self.env.event()
        self._api_seq = 0
        self.bus.listen(self._observe, ClusterReady)
        for cfg in scenario.jobs:
            self.compute.add_job(cfg)

    def _prune_idempotency(self, now: float) -> None:
        """Idempotency records older than their window go, as the embedded control plane's
        sweeper removes them: without it a 131,072-GPU year kept one per delivery, about
        460,000. Every ``PRUNE_EVERY_NTH`` time the bus forgets its ids (a store prune scans
        the collection: each time cost 2% of a run), so at most that many intervals of
        records are kept. (Event log entries are not in the store: the bus keeps the log.)"""
        self._bus_prunes += 1
        if self._bus_prunes % PRUNE_EVERY_NTH:
            return
        while prune_expired(self.store, now, retention_s=self.config.retention_s,
                            idempotency_s=self.config.idempotency_window_s,
                            limit=PRUNE_BATCH) >= PRUNE_BATCH:
            pass  # a burst (bring-up) left more than one batch behind

    # -- the API, as a user would call it
    def api(self, fn: Callable[[Any, Deps], Any]) -> Any:
        """One API call: a transaction through the real handlers' unit of work, whose
        emitted events go onto the simulated bus."""
        self._api_seq += 1
        self.api_calls.append((float(self.env.now), fn))
        if self.bus.record is not None:
            self.bus.record.append((float(self.env.now), None, None, fn))
        return apply_api(self.deps, fn, self._api_seq)

    def _observe(self, envelope: Envelope) -> None:
        if isinstance(envelope.event, ClusterReady) and self.ready_at is None:
            self.ready_at = float(self.env.now)
            self._ready.succeed()

    def _submit(self, index: int) -> None:
        from services.job_submission import commands as job_commands

        name = self.scenario.jobs[index].name
        body = job_body(self.scenario, index)
        self.api(lambda uow, deps: job_commands.submit_job(self.scenario.cluster.cluster_id, body, uow,
                                                  deps, name))

    def _start_rollout(self) -> None:
        from services.repair import rollout

        assert self.scenario.rollout is not None
        body = self.scenario.rollout.body()
        self.api(lambda uow, deps: rollout.start(self.scenario.cluster.cluster_id, body,
                                                 "twin", uow, deps))

    def rollout_outcome(self, horizon: float) -> dict[str, Any] | None:
        if self.scenario.rollout is None:
            return None
        with self.deps.uow(read_only=True) as uow:
            records: Any = uow
            found = records.records(ROLLOUTS, {"cluster_id": self.scenario.cluster.cluster_id})
        return rollout_model.outcome(found, EPOCH_S + horizon)

    # -- running
    def run(self) -> RunResult:
        with _gc_tuned():
            return self._run()

    def _run(self) -> RunResult:
        from services.job_submission import commands as job_commands

        started = time.perf_counter()
        body = cluster_body(self.scenario)
        # bring-up builds the fleet's long-lived state (nodes, documents, streams), frozen
        # right after: a collection during it scans objects that all survive (it frees
        # nothing), so none runs until the freeze
        collecting = gc.isenabled()
        gc.disable()
        self.api(lambda uow, deps: job_commands.create_cluster(body, uow, deps))
        self.env.run(until=self.env.any_of([self._ready, self.env.timeout(MAX_BRINGUP_S)]))
        if self.ready_at is None:
            raise TwinError(f"cluster not ready after {MAX_BRINGUP_S / 86400:g} simulated days")
        bringup_wall = time.perf_counter() - started
        gc.freeze()  # the fleet's long-lived objects: out of every later collection
        if collecting:
            gc.enable()
        horizon = self.ready_at + self.scenario.duration_s
        for i, job in enumerate(self.scenario.jobs):
            call_later(self.env, job.submit_at_s, self._submit, i)
        if self.scenario.rollout is not None:
            call_later(self.env, self.scenario.rollout.at_s, self._start_rollout)
        self.compute.start_processes(horizon)
        self.env.run(until=horizon)
        self.compute.finish()
        handlers_s = sum(self.bus.stats.handler_s.values())
        t_acc = time.perf_counter()
        acc = goodput.account(self.bus.rows, params=self.job_params(),
                              start=EPOCH_S + self.ready_at, end=EPOCH_S + horizon,
                              fleet_gpus=self.scenario.cluster.gpus,
                              gpus_per_node=self.scenario.cluster.gpus_per_node)
        accounting_s = time.perf_counter() - t_acc
        wall = time.perf_counter() - started
        return self._result(acc, horizon, Timings(
            wall_s=wall, bringup_s=bringup_wall, handlers_s=handlers_s,
            accounting_s=accounting_s, by_service=dict(self.bus.stats.handler_s)))

    def job_params(self) -> dict[str, goodput.JobParams]:
        out = {j.name: goodput.JobParams(
            step_time_s=j.step_time_s, checkpoint_save_s=j.checkpoint_save_s,
            checkpoint_restore_s=j.checkpoint_restore_s, startup_s=j.startup_s, mfu=j.mfu,
            checkpoint_interval_s=j.checkpoint_interval_s, nodes=j.nodes,
            all_checkpoints=self.scenario.checkpoint_events == "all")
            for j in self.scenario.jobs}
        for name, sj in self.fleet.jobs.items():
            plan = sj.plan
            if plan is not None and name in out:  # the tiers' cycle and restore per tier
                out[name] = replace(
                    out[name], checkpoint_interval_s=plan.interval_s,
                    checkpoint_save_s=plan.save_s,
                    checkpoint_restore_s=plan.restore_s[Tier.DURABLE.value],
                    restore_by_tier=tuple(sorted(plan.restore_s.items())))
        return out

    def _result(self, acc: goodput.Accounting, horizon: float, timings: Timings) -> RunResult:
        assert self.ready_at is not None
        with self.deps.uow() as uow:
            jobs = {j.job_id: j for j in uow.jobs.list()}
        interruptions: dict[str, int] = defaultdict(int)
        truth: dict[str, Any] = {}
        for name, sj in self.fleet.jobs.items():
            for cause, n in sj.truth.interruptions.items():
                interruptions[cause] += n
            t = sj.truth
            truth[name] = {
                "kept_compute_s": t.kept_compute_s, "kept_work_s": t.kept_work_s,
                "wasted_s": t.wasted_s, "save_s": t.save_s, "startup_s": t.startup_s,
                "restore_s": t.restore_s, "attempts": t.attempts,
                "failed_launches": t.failed_launches, "steps": sj.steps_done,
                "slowdown_s": dict(t.slowdown_s),
            }
            if sj.plan is not None:  # tiers: the restore by the tier it read from
                truth[name]["restore_by_tier_s"] = dict(t.restore_by_tier)
        repairs: dict[str, int] = defaultdict(int)
        held = 0
        for row in self.bus.rows:
            if row["type"] == "mtc.node.repair_started.v1":
                repairs[row["data"]["action"]] += 1
            elif row["type"] == "mtc.node.retired.v1" and row["data"].get("replacement_id"):
                repairs["replace"] += 1
            elif row["type"] == "mtc.node.repair_held.v1":
                held += 1
        repairs["held"] = held
        finished = {r["data"]["job_id"]: r["data"]["state"] for r in self.bus.rows
                    if r["type"] == JobFinished.TYPE}
        dead = len(self.store.read("dead_letters", {}))
        stats = self.bus.stats
        return RunResult(
            scenario=self.scenario, seed=self.seed, ready_at=self.ready_at,
            horizon=horizon, accounting=acc, truth=truth,
            failures=dict(self.fleet.failures), interruptions=dict(interruptions),
            repairs=dict(repairs),
            restarts={name: jobs[name].restart_count for name in jobs},
            job_states={name: finished.get(name, jobs[name].state.value) for name in jobs},
            bus={"published": stats.published, "delivered": stats.delivered,
                 "duplicates": stats.duplicates, "reordered": stats.reordered,
                 "retries": stats.retries, "gave_up": stats.gave_up,
                 "outcomes": dict(stats.outcomes), "by_type": dict(stats.by_type),
                 "errors": dict(self.bus.errors)},
            dead_letters=dead, timings=timings, timeline=list(self.fleet.timeline),
            rows=self.bus.rows, cost=self._cost(acc, horizon),
            rollout=self.rollout_outcome(horizon))

    def _cost(self, acc: goodput.Accounting, horizon: float) -> dict[str, Any]:
        capacity = self.compute.capacity
        inputs = CostInputs(node_hours_metered=capacity.meter.node_hours(horizon),
                            run_hours=horizon / 3600.0, cluster_nodes=self.scenario.cluster.nodes,
                            productive_gpu_s=acc.fleet.productive_gpu_s)
        return {**cost_summary(self.scenario.availability, inputs), **capacity.summary()}


PRUNE_BATCH = 5_000  # idempotency records removed per store call (prune_expired's default)
PRUNE_EVERY_NTH = 4  # the bus's prunes (one per 4,096 ids logged) per prune of the store
GC_THRESHOLD = (100_000, 50, 100)  # the handlers allocate many short-lived documents


@contextmanager
def _gc_tuned() -> Iterator[None]:
    """Fewer garbage-collector passes while the twin runs: a run allocates millions of
    short-lived documents and few cycles; with the default thresholds the collector scans
    the whole (large, long-lived) fleet state again and again, which made a Llama 3 run
    about 2x slower (docs/simulator.md). Everything is restored afterwards."""
    before = gc.get_threshold()
    enabled = gc.isenabled()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        if enabled:
            gc.enable()


def apply_api(deps: Deps, fn: Callable[[Any, Deps], Any], seq: int) -> Any:
    """An API call as the HTTP API makes it (``run_command``); its events go to the bus."""
    return run_command(deps, lambda uow: fn(uow, deps), key=f"//mtc/sim/api#{seq}")


def run(scenario: Scenario, *, seed: int | None = None,
        config: ControlPlaneConfig | None = None, store: Any = None) -> RunResult:
    """Simulate ``scenario`` once with the real control plane in the loop."""
    return Twin(scenario, seed=seed, config=config, store=store).run()
