"""The simulated Compute port: ``shared.ports.Compute`` over the twin's fleet, on SimPy time.

:class:`SimCompute` builds the twin's one :class:`~simulator.fleet.Fleet` and the
collaborators that hold it, and implements the port (with batch provisioning, deep checks and
preflight) by delegating to them: provisioning, deletion and repairs to the machines
(:mod:`simulator.machines`), a new attempt to the launches (:mod:`simulator.launches`),
signals and stops to the analytic job model (:mod:`simulator.jobs`), deep checks to the node
agent (:mod:`simulator.agent`), preflight to its price (:mod:`simulator.preflight_model`).
What is reported once per key goes through the attempt/repair ledger that every Compute
adapter shares (``shared.adapters.compute.ledger``, on the fleet): an attempt starts once and
ends in one ``JobWorkersExited``, each checkpoint step is reported once, a repair runs once per
(node, attempt) and completes once; exit codes are the worker protocol's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import simpy

from shared.domain.health import RepairAction
from shared.domain.model import Node
from shared.policies.preflight import PreflightPlan, PreflightResult
from shared.ports import Gang
from simulator import preflight_model
from simulator.agent import Agent
from simulator.bus import SimBus
from simulator.capacity import Capacity, rng_for
from simulator.failure_processes import FailureProcesses
from simulator.failures import FailureModel
from simulator.fleet import Fleet
from simulator.jobs import JobModel
from simulator.launches import Launches
from simulator.machines import Machines
from simulator.scenario_types import JobCfg, Scenario
from simulator.slow_in_job import SlowInJob
from simulator.stragglers import Stragglers
from simulator.tiers import Tiers
from simulator.world import SimJob


class SimCompute:
    """The Compute port over a simulated fleet (see the module docstring)."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, bus: SimBus,
                 model: FailureModel, rng: np.random.Generator, *,
                 return_after_passes: int, heartbeat_timeout_s: float,
                 capacity: Capacity | None = None) -> None:
        fleet = self.fleet = Fleet(env, scenario, bus, model, rng)
        # how capacity is bought (queue waits, spot preemptions) and the node-hour meter
        self.capacity = capacity or Capacity(env, scenario.availability, rng_for(0))
        self.agent = Agent(fleet, return_after_passes=return_after_passes,
                           heartbeat_timeout_s=heartbeat_timeout_s)
        if scenario.rollout is not None and scenario.rollout.bad:
            self.agent.bad_version = dict(scenario.rollout.version)
        self.slow = SlowInJob(fleet)
        self.job_model = JobModel(fleet, Tiers(fleet), self.agent)
        self.stragglers = Stragglers(fleet, self.job_model, self.slow)
        self.failures = FailureProcesses(fleet, self.job_model, self.agent, self.stragglers)
        self.machines = Machines(fleet, self.job_model, self.agent, self.failures,
                                 self.capacity)
        self.launches = Launches(fleet, self.job_model, self.stragglers, self.slow)
        self.calls = 0  # the port's calls

    # -- the twin's own controls
    def add_job(self, cfg: JobCfg) -> SimJob:
        """A job of the scenario, known to the simulated workers before it is submitted."""
        return self.job_model.add_job(cfg)

    def start_processes(self, horizon: float) -> None:
        """The run begins (the cluster is ready): node faults, stragglers, planned restarts
        and spot preemptions start, each up to ``horizon``."""
        self.fleet.horizon = horizon
        self.failures.start()
        self.stragglers.start()
        self.failures.start_planned()
        self.capacity.start(self.fleet, self.job_model)

    def finish(self) -> None:
        """At the horizon: the attempts still running are accounted."""
        self.job_model.finish()

    # -- the port
    def provision_nodes(self, nodes: Sequence[Node]) -> None:
        self.calls += len(nodes)
        self.machines.provision_nodes(nodes)

    def provision_node(self, node: Node) -> None:
        self.calls += 1
        self.machines.provision_node(node)

    def cordon(self, node_id: str, reason: str) -> None:
        """No new work on the node: the control plane's own state already says so."""
        self.calls += 1
        self.fleet.cordoned.add(node_id)

    def uncordon(self, node_id: str) -> None:
        self.calls += 1
        self.fleet.cordoned.discard(node_id)

    def delete_node(self, node_id: str) -> None:
        self.calls += 1
        self.machines.delete_node(node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        self.calls += 1
        self.machines.start_repair(node_id, action, attempt)

    def stage_software(self, node_id: str, version: Mapping[str, str]) -> None:
        """``SoftwareImages``: the version the node's next reimage writes."""
        self.calls += 1
        self.agent.staged[node_id] = dict(version)

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        self.calls += 1
        self.agent.start_deep_check(node_id, attempt)

    def start_workers(self, gang: Gang) -> None:
        self.calls += 1
        self.launches.start(gang)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        self.calls += 1
        self.job_model.signal(job_id, attempt, grace_s)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self.calls += 1
        self.job_model.stop(job_id, attempt)

    def run_preflight(self, job_id: str, node_ids: Sequence[str], plan: PreflightPlan
                      ) -> PreflightResult:
        """The Preflight port, priced (``simulator.preflight_model``)."""
        return preflight_model.run(self.fleet, self.fleet.sc.cluster.preflight, job_id,
                                   node_ids, plan)
