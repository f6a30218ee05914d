"""An in-memory control plane for handler tests: real handlers, real bus, fake compute."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from services.wiring.builder import build_deps
from services.wiring.routes import control_plane_routes
from shared.adapters.compute.ledger import (
    MemoryLedger,
    checkpoint_saved,
    repair_completed,
    workers_exited,
)
from shared.adapters.docstore import DocUnitOfWork
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.outbox import make_envelope
from shared.adapters.outbox_bus import OutboxBus
from shared.config import ControlPlaneConfig
from shared.domain.events import (
    Envelope,
    Event,
    JobWorkersExited,
    NodeHealthReported,
    NodeProvisioned,
    NodeRepairCompleted,
)
from shared.domain.health import Condition, ConditionStatus, ConditionType, RepairAction
from shared.domain.model import Node
from shared.handling import Deps
from shared.ports import Gang, LaunchGroup, WorkerSpec

E = TypeVar("E", bound=Event)


@dataclass
class Recorder:
    """An ``emit`` callback for compute adapters: keeps what they reported."""

    events: list[Event] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]


class ManualClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class FakeCompute:
    """Records what the control plane asked of the machines; tests play the machines.

    Handler tests inject the machines' answers themselves (``Plane``). Given an ``emit``, the
    fake also answers like a real adapter, through the shared ledger, when a test plays the
    machines with ``complete_provisioning``/``complete_repairs``/``checkpoint``/
    ``exit_workers``: each fact once per key (the Compute contract suite runs over it)."""

    provisioned: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    repairs: list[tuple[str, RepairAction, int]] = field(default_factory=list)
    gangs: list[Gang] = field(default_factory=list)
    signalled: list[tuple[str, int]] = field(default_factory=list)
    stopped: list[tuple[str, int]] = field(default_factory=list)
    cordoned: set[str] = field(default_factory=set)
    deep_checks: list[tuple[str, int]] = field(default_factory=list)
    staged: dict[str, dict[str, str]] = field(default_factory=dict)  # (SoftwareImages)
    emit: Callable[[Event], None] | None = None
    clock: ManualClock = field(default_factory=ManualClock)
    ledger: MemoryLedger = field(default_factory=MemoryLedger)
    _up: set[str] = field(default_factory=set)
    _checked: set[tuple[str, int]] = field(default_factory=set)

    def provision_node(self, node: Node) -> None:
        if node.node_id not in self.provisioned:
            self.provisioned.append(node.node_id)

    def cordon(self, node_id: str, reason: str) -> None:
        self.cordoned.add(node_id)

    def uncordon(self, node_id: str) -> None:
        self.cordoned.discard(node_id)

    def delete_node(self, node_id: str) -> None:
        if node_id not in self.deleted:
            self.deleted.append(node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        """Once per (node, attempt), even with another action."""
        if all((n, a) != (node_id, attempt) for n, _, a in self.repairs):
            self.repairs.append((node_id, action, attempt))
            self.ledger.start_repair(node_id, attempt, RepairAction(action).value,
                                     self.clock.now())

    def stage_software(self, node_id: str, version: Mapping[str, str]) -> None:
        self.staged[node_id] = dict(version)

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """Once per (node, attempt); ``complete_deep_checks`` (or a test) answers."""
        if (node_id, attempt) not in self.deep_checks:
            self.deep_checks.append((node_id, attempt))

    @property
    def started(self) -> list[WorkerSpec]:
        """Every rank started so far, gang after gang (what tests read)."""
        return [w for g in self.gangs for w in g.workers()]

    def start_workers(self, gang: Gang) -> None:
        """Once per (job, attempt)."""
        if any((g.job_id, g.attempt) == (gang.job_id, gang.attempt) for g in self.gangs):
            return
        self.gangs.append(gang)
        self.ledger.start_attempt(gang.job_id, gang.attempt, gang.world_size,
                                  gang.checkpoint_dir, self.clock.now())
        for rank in range(gang.world_size):
            self.ledger.start_rank(gang.job_id, gang.attempt, rank)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        if (job_id, attempt) not in self.signalled:
            self.signalled.append((job_id, attempt))

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self.stopped.append((job_id, attempt))

    # -- playing the machines, answering as an adapter would
    def _answer(self, event: Event | None) -> None:
        if event is not None and self.emit is not None:
            self.emit(event)

    def complete_provisioning(self) -> None:
        for node_id in self.provisioned:
            if node_id not in self._up and node_id not in self.deleted:
                self._up.add(node_id)
                self._answer(NodeProvisioned(node_id=node_id))

    def complete_repairs(self, ok: bool = True) -> None:
        """Every repair not completed yet completes, then its post-repair check reports."""
        now = self.clock.now()
        for (node_id, attempt), rec in list(self.ledger.repairs.items()):
            done = repair_completed(self.ledger, node_id, attempt, rec.action, ok, "", now)
            self._answer(done)
            if done is not None and ok:
                self._answer(NodeHealthReported(node_id=node_id, observed_at=now,
                                                conditions=healthy(now),
                                                source="post-repair-check"))

    def complete_deep_checks(self) -> None:
        """Every deep check not answered yet passes (both checks ``false``), once."""
        now = self.clock.now()
        for node_id, attempt in self.deep_checks:
            if (node_id, attempt) in self._checked:
                continue
            self._checked.add((node_id, attempt))
            self._answer(NodeHealthReported(node_id=node_id, observed_at=now,
                                            conditions=deep_check_results(now, attempt),
                                            source="deep-check"))

    def checkpoint(self, job_id: str, attempt: int, step: int) -> None:
        path = f"fake://{job_id}/ckpt-{step:08d}"
        self._answer(checkpoint_saved(self.ledger, job_id, attempt, f"fake://{job_id}", step,
                                      path, self.clock.now()))

    def exit_workers(self, job_id: str, attempt: int, code: int) -> None:
        self._answer(workers_exited(self.ledger, job_id, attempt, code, f"exit code {code}"))


def one_pool_gang(job_id: str, attempt: int, node_ids: Sequence[str], command: Sequence[str],
                  env: Sequence[tuple[str, str]] = (), *, out: Path | str) -> Gang:
    """A gang of one worker pool, its outputs under ``out`` (checkpoints/, model/, logs/)."""
    base = Path(out)
    return Gang(job_id, attempt, tuple(node_ids),
                (LaunchGroup(0, len(node_ids), tuple(command), tuple(env)),),
                str(base / "checkpoints"), str(base / "model"), str(base / "logs"))


def healthy(observed_at: float) -> tuple[dict[str, Any], ...]:
    return tuple(
        Condition(t.value, ConditionStatus.FALSE, "checked", observed_at).to_dict()
        for t in ConditionType if t is not ConditionType.HEARTBEAT_LOST
    )


def deep_check_results(observed_at: float, attempt: int, *, dcgm: str = "false",
                       bandwidth: str = "false") -> tuple[dict[str, Any], ...]:
    """What a deep check reports: DCGM level 3 and the collective test, tagged with its key."""
    return (
        Condition(ConditionType.DCGM_DIAG_FAILED.value, ConditionStatus(dcgm), f"dcgm {dcgm}",
                  observed_at, {"level": 3, "deep_check_attempt": attempt}).to_dict(),
        Condition(ConditionType.COLLECTIVE_BANDWIDTH_LOW.value, ConditionStatus(bandwidth),
                  f"busbw {bandwidth}", observed_at,
                  {"deep_check_attempt": attempt, "corrupt": False}).to_dict(),
    )


def xid(code: int, observed_at: float) -> tuple[dict[str, Any], ...]:
    return (Condition(ConditionType.XID_ERROR.value, ConditionStatus.TRUE, f"Xid {code}",
                      observed_at, {"xids": [code]}).to_dict(),)


class Plane:
    """Real handlers over an in-memory store; `deliver` runs the bus until it is quiet."""

    def __init__(self, config: ControlPlaneConfig | None = None) -> None:
        self.store = MemoryDocStore()
        self.clock = ManualClock()
        self.compute = FakeCompute()
        self.bus = OutboxBus(self.store, control_plane_routes())
        self.deps: Deps = build_deps(self.store, clock=self.clock, compute=self.compute,
                                     publisher=self.bus, config=config)
        self.delivered: list[Envelope] = []
        self.bus.listeners.append(lambda env, _: self.delivered.append(env))

    def uow(self) -> DocUnitOfWork:
        return self.deps.uow()  # type: ignore[no-any-return]

    def api(self, fn: Any, *args: Any) -> Any:
        with self.uow() as uow:
            result = fn(*args, uow, self.deps)
            uow.commit()
        return result

    def inject(self, event: Event, source: str = "//test") -> Envelope:
        env = make_envelope(event, source, self.clock.now())
        self.bus.inject(env)
        return env

    def deliver(self) -> int:
        return self.bus.pump(self.deps)

    def up(self, cluster: dict[str, Any] | None = None) -> Plane:
        """The cluster (``CLUSTER`` unless given) created and every node through its checks:
        where most handler tests start."""
        from services.job_submission import commands as job_commands

        self.api(job_commands.create_cluster, CLUSTER if cluster is None else cluster)
        self.deliver()
        self.bring_up()
        return self

    def node(self, node_id: str) -> Node:
        with self.uow() as uow:
            node = uow.nodes.get(node_id)
        assert node is not None, node_id
        return node

    def job(self, job_id: str) -> Any:
        with self.uow() as uow:
            return uow.jobs.get(job_id)

    def nodes(self, cluster_id: str) -> list[Node]:
        with self.uow() as uow:
            return sorted(uow.nodes.list(cluster_id), key=lambda n: n.node_id)

    # -- playing the machines
    def bring_up(self) -> None:
        """Every provisioned node comes up and passes enough checks to enter service."""
        for node_id in list(self.compute.provisioned):
            self.inject(NodeProvisioned(node_id=node_id))
        self.deliver()
        for _ in range(self.deps.config.repair.return_after_passes):
            self.clock.advance(1)
            for node_id in list(self.compute.provisioned):
                self.report(node_id, healthy(self.clock.now()))
            self.deliver()

    def report(self, node_id: str, conditions: tuple[dict[str, Any], ...],
               source: str = "agent") -> Envelope:
        return self.inject(NodeHealthReported(node_id=node_id, observed_at=self.clock.now(),
                                              conditions=conditions, source=source))

    def finish_repairs(self, ok: bool = True) -> None:
        for node_id, action, attempt in list(self.compute.repairs):
            self.inject(NodeRepairCompleted(node_id=node_id, action=action.value,
                                            attempt=attempt, ok=ok))
        self.compute.repairs.clear()
        self.deliver()

    def exit_workers(self, job_id: str, attempt: int, code: int) -> None:
        self.inject(JobWorkersExited(job_id=job_id, attempt=attempt, exit_code=code))
        self.deliver()


CLUSTER = {
    "clusterId": "c1",
    "nodePools": [{"id": "gpu", "nodeCount": 4, "spareCount": 1,
                   "machineSpec": {"machineType": "a3-highgpu-8g",
                                   "acceleratorType": "NVIDIA_H100_80GB",
                                   "acceleratorCount": 8}}],
    "partitions": [{"name": "train", "nodePoolIds": ["gpu"]}],
}


def job_body(replicas: int = 2) -> dict[str, Any]:
    return {
        "displayName": "train",
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g",
                            "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
            "replicaCount": replicas,
            "containerSpec": {"imageUri": "local", "command": ["python3", "train.py"]},
        }]},
    }
