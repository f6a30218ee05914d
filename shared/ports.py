"""The ports: what handlers need from the outside world, as Protocols.

Adapters (embedded, simulation, GCP, Slurm) implement them; ``shared/bootstrap.py`` is the
only place that picks which.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from shared.domain.events import Envelope, Event
from shared.domain.health import RepairAction
from shared.domain.model import Cluster, Job, Node, Partition


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (simulated time in the simulator)."""
        ...


class ClusterRepo(Protocol):
    def get(self, cluster_id: str) -> Cluster | None: ...
    def add(self, cluster: Cluster) -> None: ...
    def list(self) -> list[Cluster]: ...


class NodeRepo(Protocol):
    def get(self, node_id: str) -> Node | None: ...
    def add(self, node: Node) -> None: ...
    def list(self, cluster_id: str, **equals: Any) -> list[Node]: ...


class JobRepo(Protocol):
    def get(self, job_id: str) -> Job | None: ...
    def add(self, job: Job) -> None: ...
    def list(self, cluster_id: str | None = None, **equals: Any) -> list[Job]: ...


class PartitionRepo(Protocol):
    def get(self, cluster_id: str, name: str) -> Partition | None: ...
    def add(self, partition: Partition) -> None: ...
    def list(self, cluster_id: str) -> list[Partition]: ...


class UnitOfWork(Protocol):
    """One transaction: entity changes, the idempotency record and the outbox commit together."""

    @property
    def clusters(self) -> ClusterRepo: ...
    @property
    def nodes(self) -> NodeRepo: ...
    @property
    def jobs(self) -> JobRepo: ...
    @property
    def partitions(self) -> PartitionRepo: ...

    def __enter__(self) -> UnitOfWork: ...
    def __exit__(self, *exc: object) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...

    def caused_by(self, key: str) -> None:
        """Derive outbox event ids from the triggering event's key (stable across re-runs)."""
        ...
    def already_processed(self, key: str) -> bool: ...
    def mark_processed(self, key: str, now: float) -> None: ...
    def emit(self, event: Event) -> None:
        """Queue an event in the outbox; it is published only if the transaction commits."""
        ...


class UnitOfWorkFactory(Protocol):
    def __call__(self) -> UnitOfWork: ...


class Publisher(Protocol):
    def publish(self, envelope: Envelope) -> None: ...


class Outbox(Protocol):
    """Events committed but not yet published; the sweeper republishes what a crash left."""

    def pending(self, limit: int = 100) -> Sequence[Envelope]: ...
    def mark_published(self, ids: Sequence[str]) -> None: ...


class EventLog(Protocol):
    """Every handled event, for the timeline (`mtc events`) and goodput accounting."""

    def append(self, envelope: Envelope, outcome: str, detail: str = "") -> None: ...
    def read(self, since: float = 0.0) -> Iterator[dict[str, Any]]: ...


class WorkerSpec(NamedTuple):
    """What compute needs to start one replica of a job attempt (a tuple: a 2,048-node job
    builds 2,048 of these per restart)."""

    job_id: str
    attempt: int
    rank: int
    world_size: int
    node_id: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    checkpoint_dir: str
    model_dir: str
    tensorboard_dir: str


class Compute(Protocol):
    """The machines. Every call is idempotent by its key and returns at once; results come
    back later as events (node.provisioned, node.repair_completed, job.workers_exited,
    job.checkpoint_saved, node.health_reported)."""

    def provision_node(self, node: Node) -> None: ...
    def cordon(self, node_id: str, reason: str) -> None:
        """No new work on the node (Slurm: drain). Running work is left to checkpoint."""
        ...
    def uncordon(self, node_id: str) -> None:
        """The node passed its checks: it may take work again (Slurm: resume)."""
        ...
    def delete_node(self, node_id: str) -> None: ...
    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None: ...
    def start_workers(self, workers: Sequence[WorkerSpec]) -> None: ...
    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM now, SIGKILL after the grace period: the job checkpoints and exits."""
        ...
    def stop_workers(self, job_id: str, attempt: int) -> None: ...
