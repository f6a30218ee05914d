"""The twin's one fleet: the state every part of the simulated compute acts on.

:class:`Fleet` holds the SimPy environment, the scenario, the bus, the failure model and the
compute's random stream, the nodes and jobs (:mod:`simulator.world`), the indices kept over
them and the timeline of what happened. The parts of the simulated compute are collaborators
that each hold this one object: the node agent (:mod:`simulator.agent`), the machines'
lifecycle (:mod:`simulator.machines`), the job model (:mod:`simulator.jobs`), launches
(:mod:`simulator.launches`), the tiers (:mod:`simulator.tiers`), the failure processes
(:mod:`simulator.failure_processes`, :mod:`simulator.stragglers`), slow-in-job
(:mod:`simulator.slow_in_job`) and the capacity (:mod:`simulator.capacity`);
:class:`simulator.compute.SimCompute` implements the Compute port by delegating to them.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import simpy

from shared.adapters.compute.ledger import MemoryLedger
from shared.domain.events import Event, JobCheckpointSaved, JobWorkersExited, NodeRepairCompleted
from simulator.bus import SimBus
from simulator.failures import FailureModel
from simulator.picking import Qualifying
from simulator.scenario_types import Scenario
from simulator.world import COMPUTE_SOURCE, SimJob, SimNode


class Fleet:
    """The simulated world's state, shared by the compute's collaborators."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, bus: SimBus,
                 model: FailureModel, rng: np.random.Generator) -> None:
        self.env = env
        self.sc = scenario
        self.bus = bus
        self.model = model
        self.rng = rng  # the compute's stream: stragglers, planned restarts
        self.nodes: dict[str, SimNode] = {}
        self.by_partition: dict[str, list[str]] = defaultdict(list)
        self.by_rack: dict[str, list[str]] = defaultdict(list)  # (nodes with a rack)
        self.jobs: dict[str, SimJob] = {}
        self.stragglers: dict[str, float] = {}  # node -> its ranks' speed ratio
        self.slow_seen: set[tuple[str, int, str, float]] = set()  # SlowInJob scheduled
        self.preflight_until: dict[str, float] = {}  # job -> when its preflight run ends
        self.unfit: set[str] = set()  # deleted, down or with a fault that blocks a launch
        self.drawable = Qualifying()  # by fleet position: may become a straggler
        self.positions: dict[str, int] = {}  # node id -> its position in the fleet's order
        self.fleet_order: list[SimNode] = []  # the nodes in the order the fleet gained them
        self.ledger = MemoryLedger()
        self.cordoned: set[str] = set()
        self.failures: dict[str, int] = defaultdict(int)  # root faults by cause (every node)
        self.repairs_done: dict[str, int] = defaultdict(int)
        self.planned = 0
        self.timeline: list[tuple[float, str, str, str]] = []  # (t, kind, node/job, detail)
        self.horizon = math.inf

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

    def fitness_changed(self, node: SimNode) -> None:
        """Keep ``unfit`` (the nodes no attempt can launch on) and ``drawable`` (those that may
        become stragglers) up to date: called wherever a node goes down, is deleted, gains or
        loses a fault, or starts or stops straggling."""
        fault = node.fault
        if node.deleted or not node.up or (fault is not None and fault.signal.blocks_launch):
            self.unfit.add(node.node_id)
        else:
            self.unfit.discard(node.node_id)
        at = self.positions.get(node.node_id)
        if at is not None:
            self.drawable.set(at, self._drawable(node))

    def enlist(self, node: SimNode) -> None:
        """A node joins the fleet, last in its order."""
        self.positions[node.node_id] = self.drawable.append(self._drawable(node))
        self.fleet_order.append(node)

    def reindex(self) -> None:
        """Build the fleet's order again from ``nodes`` (a fleet not built through
        ``enlist``: tests that set nodes directly)."""
        self.drawable, self.positions, self.fleet_order = Qualifying(), {}, []
        for node in self.nodes.values():
            self.enlist(node)

    def _drawable(self, node: SimNode) -> bool:
        return node.up and not node.deleted and node.node_id not in self.stragglers \
            and bool(node.partition)
