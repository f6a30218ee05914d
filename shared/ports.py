"""The ports: what handlers need from the outside world, as Protocols.

Adapters (embedded, simulation, GCP, Slurm) implement them; ``services/wiring`` is the only
place that picks which.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from shared.domain.events import Envelope, Event
from shared.domain.health import Condition, RepairAction
from shared.domain.model import Cluster, Job, Node, Partition
from shared.policies.preflight import PreflightPlan, PreflightResult
from shared.store_ports import Claiming as Claiming
from shared.store_ports import DocStore as DocStore
from shared.store_ports import DocTransaction as DocTransaction
from shared.store_ports import IndexedQueries as IndexedQueries
from shared.store_ports import IndexedTransaction as IndexedTransaction
from shared.store_ports import KeyedTransaction as KeyedTransaction
from shared.store_ports import KeyQueries as KeyQueries
from shared.store_ports import KeysOnly as KeysOnly
from shared.store_ports import PageKey as PageKey
from shared.store_ports import Projection as Projection
from shared.store_ports import Pruning as Pruning
from shared.store_ports import RangeReads as RangeReads
from shared.store_ports import ReadOnlyWrite as ReadOnlyWrite


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
    def ids(self, cluster_id: str, **equals: Any) -> AbstractSet[str]:
        """The ids ``list`` would return, without reading the nodes (keys only); read-only,
        and valid while the unit of work lasts."""
        ...
    def project(self, cluster_id: str, fields: tuple[str, ...], **equals: Any
                ) -> builtins.list[tuple[Any, ...]]:
        """The stored fields ``fields`` of the nodes ``list`` would return (a projection)."""
        ...


class JobRepo(Protocol):
    def get(self, job_id: str) -> Job | None: ...
    def get_on(self, cluster_id: str, job_id: str) -> Job | None:
        """The job if it runs on ``cluster_id``, else None (``DocTransaction.get_if``)."""
        ...
    def add(self, job: Job) -> None: ...
    def list(self, cluster_id: str | None = None, **equals: Any) -> list[Job]: ...
    def ids(self, **equals: Any) -> AbstractSet[str]:
        """The ids of the jobs whose fields equal ``equals``, without reading the jobs (keys
        only); read-only, and valid while the unit of work lasts."""
        ...


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
    def mark_processed(self, key: str, now: float, *, expire_at: float | None = None
                       ) -> None: ...
    def emit(self, event: Event) -> None:
        """Queue an event in the outbox; it is published only if the transaction commits."""
        ...
    @property
    def emitted(self) -> bool:
        """Whether this transaction has queued any event so far."""
        ...
    @property
    def committed(self) -> list[Envelope]:
        """The envelopes the last commit wrote to the outbox, to publish now."""
        ...


class UnitOfWorkFactory(Protocol):
    def __call__(self, *, read_only: bool = False) -> UnitOfWork:
        """``read_only``: over a read-only transaction; committing one that changed anything
        raises ``ReadOnlyWrite``."""
        ...


class Publisher(Protocol):
    def publish(self, envelope: Envelope) -> None: ...


class Emitter(Protocol):
    """Publishes an event from outside any transaction (compute adapters, node agents), under
    the CloudEvent source it was bound to (``shared.adapters.outbox.SourceEmitter``)."""

    def __call__(self, event: Event) -> None: ...


class Outbox(Protocol):
    """Events committed but not yet published; the sweeper republishes what a crash left."""

    def pending(self, limit: int = 100) -> Sequence[Envelope]: ...
    def mark_published(self, ids: Sequence[str]) -> None: ...


class EventLog(Protocol):
    """Every handled event, for the timeline (`mtc events`) and goodput accounting."""

    def append(self, envelope: Envelope, outcome: str, detail: str = "") -> None: ...
    def read(self, since: float = 0.0) -> Iterator[dict[str, Any]]: ...


class WorkflowRunner(Protocol):
    """Starts an execution of the provisioning workflow (Cloud Workflows) with its argument."""

    def start(self, argument: Mapping[str, Any]) -> str: ...


class WorkerSpec(NamedTuple):
    """One rank of a ``Gang``: the view of adapters that start a process per rank."""

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
    # the gs:// buckets the job's spec names, all its project's (the API refuses another
    # project's at create): the only ones its command's package files may be read from
    buckets: tuple[str, ...] = ()
    limits: tuple[int, int] = (0, 0)  # its node's (processes, memory bytes): LaunchGroup's


_new_spec = functools.partial(tuple.__new__, WorkerSpec)  # a WorkerSpec from a tuple, in C


@dataclass(frozen=True, slots=True)
class LaunchGroup:
    """The ranks of one worker pool: ``count`` ranks from ``first_rank`` run one command with
    one environment, so the command and env exist once per pool, not once per rank."""

    first_rank: int
    count: int
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    limits: tuple[int, int] = (0, 0)  # per node: (processes, memory bytes); 0: none


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """How an attempt was started after an incident (``shared.policies.recovery``): ``mode``
    is a ``Mode`` value; ``fresh_node_ids`` the nodes new to the job (a hot swap's spare):
    they start cold and their ranks restore from the peer tier, the others are warm and
    restore from memory. Adapters tell the workers through ``MTC_RECOVERY_MODE``."""

    mode: str
    fresh_node_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Gang:
    """One job attempt's workers, started together: one value per restart whatever the job's
    size (a 2,048-node job is one gang, not 2,048 specs). ``node_ids[r]`` runs rank ``r``;
    the groups number the ranks pool after pool and must cover 0..world_size-1 exactly."""

    job_id: str
    attempt: int
    node_ids: tuple[str, ...]
    groups: tuple[LaunchGroup, ...]
    checkpoint_dir: str
    model_dir: str
    tensorboard_dir: str
    recovery: RecoveryPlan | None = None  # None: a requeue or a first start
    buckets: tuple[str, ...] = ()  # WorkerSpec.buckets

    def __post_init__(self) -> None:
        """O(pools), not O(ranks): a gang that exists is one an adapter can start."""
        if not self.node_ids:
            raise ValueError(f"gang {self.job_id}/{self.attempt}: no ranks (node_ids is empty)")
        first = 0
        for i, g in enumerate(self.groups):
            if g.first_rank != first:
                raise ValueError(f"gang {self.job_id}/{self.attempt}: groups[{i}].first_rank is "
                                 f"{g.first_rank}, expected {first} (pool after pool)")
            if g.count < 1:
                raise ValueError(f"gang {self.job_id}/{self.attempt}: groups[{i}].count is "
                                 f"{g.count}, must be at least 1")
            first += g.count
        if first != len(self.node_ids):
            raise ValueError(f"gang {self.job_id}/{self.attempt}: groups cover {first} ranks, "
                             f"node_ids {len(self.node_ids)}")

    @property
    def world_size(self) -> int:
        return len(self.node_ids)

    def workers(self) -> Iterator[WorkerSpec]:
        """The per-rank specs, by rank (made in C: no Python call per rank)."""
        world, nodes = len(self.node_ids), self.node_ids
        for g in self.groups:
            n, first = g.count, g.first_rank
            yield from map(_new_spec, zip(
                repeat(self.job_id, n), repeat(self.attempt, n), range(first, first + n),
                repeat(world, n), nodes[first:first + n], repeat(g.command, n),
                repeat(g.env, n), repeat(self.checkpoint_dir, n), repeat(self.model_dir, n),
                repeat(self.tensorboard_dir, n), repeat(self.buckets, n), repeat(g.limits, n),
                strict=True))


class AdviceSink(Protocol):
    """Where a job's program can read what the control plane advises it (the checkpoint
    interval): an environment file beside its checkpoint directory (``FileAdviceSink``)."""

    def publish(self, checkpoint_path: str, job_id: str, env: Mapping[str, str]) -> None:
        """``env`` for the job whose checkpoint is at ``checkpoint_path``; best effort."""
        ...


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
    def start_workers(self, gang: Gang) -> None:
        """Start the attempt's ranks; a repeat for the same (job, attempt) is a no-op."""
        ...
    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM now, SIGKILL after the grace period: the job checkpoints and exits."""
        ...
    def stop_workers(self, job_id: str, attempt: int) -> None: ...


# -- compute capabilities: what a Compute may offer beyond the port. Callers test for the
# declared port (``isinstance``), never for an attribute by name.


@runtime_checkable
class BatchProvisioning(Protocol):
    """A Compute that takes many machines in one request (GCE's ``instances.bulkInsert``;
    the twin, which seeds all their random streams in one vectorized pass). Optional: what
    it does must be what ``provision_node`` does for each node, in order."""

    def provision_nodes(self, nodes: Sequence[Node]) -> None: ...


@runtime_checkable
class DeepChecks(Protocol):
    """A Compute that runs deep checks (``shared.service_layer.deep_checks``): run them once per
    (node, attempt), and report the results later as a ``NodeHealthReported`` with source
    ``deep-check`` whose conditions carry ``details["deep_check_attempt"]``."""

    def start_deep_check(self, node_id: str, attempt: int) -> None: ...


@runtime_checkable
class SoftwareImages(Protocol):
    """A Compute that reimages a node with a chosen software version (a rollout,
    ``services.repair.rollout``): ``stage_software`` names the version (nodeImage, driver,
    agent) the node's next reimage (``start_repair`` with REIMAGE) writes."""

    def stage_software(self, node_id: str, version: Mapping[str, str]) -> None: ...


@runtime_checkable
class Preflight(Protocol):
    """A Compute that checks a gang's nodes together before they run it
    (``shared.service_layer.preflight``): bounded by ``plan.timeout_s`` and answered at once
    (the embedded default runs a real gloo all-reduce among local processes,
    ``shared.adapters.compute.preflight_gloo``)."""

    def run_preflight(self, job_id: str, node_ids: Sequence[str], plan: PreflightPlan
                      ) -> PreflightResult: ...


@runtime_checkable
class ActiveChecks(Protocol):
    """A Compute that runs active checks on an idle node
    (``shared.service_layer.active_checks``): a known-answer compute test, a short DCGM
    diagnostic and a thermal read, reported later as a ``NodeHealthReported`` with source
    ``active-check``; ``cancel_active_check`` when a job wants the node (a check never delays a
    job)."""

    def start_active_check(self, node_id: str, key: str) -> None: ...
    def cancel_active_check(self, node_id: str, key: str) -> None: ...


@runtime_checkable
class Polled(Protocol):
    """A Compute that learns what happened by looking (Slurm, Compute Engine, local
    processes): someone beside it calls ``poll`` on a cadence to turn what it sees into
    events. A Compute that is told (the executor's client, the twin) has none."""

    def poll(self) -> None: ...


@runtime_checkable
class StorageSpace(Protocol):
    """A Compute that can read the file system holding a job's files (``statvfs`` of the
    path, or of its nearest existing parent): ``(free, total)`` bytes, free as an
    unprivileged writer sees it; None when it cannot be read. A job that a full disk
    interrupted waits until this shows room (``shared.domain.storage``)."""

    def storage_space(self, path: str) -> tuple[int, int] | None: ...


@runtime_checkable
class FaultInjection(Protocol):
    """A Compute that can make a node report a fault (local nodes, the twin's fleet): the
    API's and CLI's ``node fault`` for demos and tests; real machines report their own."""

    def inject_fault(self, node_id: str, conditions: Sequence[Condition]) -> None: ...


@runtime_checkable
class Closeable(Protocol):
    """An adapter that holds a resource (a state file, a client) to release at shutdown."""

    def close(self) -> None: ...


# -- warm processes: what a backend's start loop asks before it launches a rank, and before
# it SIGTERMs one. A collaborator the backend holds, not a Compute method: the control plane
# never calls it (an in-place restart is allowed on any backend; warm processes make its
# measured warm start cheaper).


class RankProcess(NamedTuple):
    """The process a rank runs in, as a backend records it: its launcher's pid and start
    ticks (a reused pid is not it), its exit file and its control file (``MTC_RESTART_FILE``)."""

    pid: int
    start_ticks: int
    exit_file: str
    control_file: str


Tx = TypeVar("Tx", contravariant=True)


@runtime_checkable
class WarmProcesses(Protocol[Tx]):
    """Ranks that go on in a running process instead of a new one: a rank held (not
    SIGTERMed) when its attempt ended, or its node's standby, restarted by an order in its
    control file (``mtc_program.inprocess``). A backend's start loop asks, for each rank of an
    in-place, hot-swap or scale-down attempt, for a warm process before it launches one;
    each call runs in the backend's transaction ``tx``. The local compute has one
    (``local.warm``), and Slurm's with warm processes on (``slurm.warm``)."""

    def take(self, tx: Tx, spec: WorkerSpec, plan: RecoveryPlan | None,
             env: Mapping[str, str], log: str) -> RankProcess | None:
        """A running process of the job on the rank's node (not a fresh one), ordered to go
        on as this rank with ``env`` and ``log``; None: launch one."""
        ...
    def want(self, tx: Tx, spec: WorkerSpec, env: Mapping[str, str]) -> None:
        """Keep a standby on the rank's node, started with ``env`` once its program declared."""
        ...
    def settle(self, tx: Tx, gang: Gang, now: float) -> None:
        """The gang started: held processes none of its ranks took, and standbys on nodes it
        left, end."""
        ...
    def hold(self, tx: Tx, job_id: str, attempt: int) -> AbstractSet[int]:
        """Ask the attempt's live ranks whose program restarts in process to hold: the ranks
        asked, now or before (the caller SIGTERMs the others)."""
        ...
    def park(self, tx: Tx, job_id: str, attempt: int, now: float) -> Mapping[int, int]:
        """The attempt's ranks that answered their hold, kept for the next attempt: rank ->
        the exit code their attempt records (75, what they would have exited with)."""
        ...
    def end(self, tx: Tx, job_id: str | None, now: float) -> None:
        """The job's warm processes end (SIGTERM, SIGKILL after the grace); None: every
        job's, SIGKILL now."""
        ...
    def tick(self, tx: Tx, now: float) -> None:
        """The periodic pass: what was not taken in time ends, standbys are renewed and
        started."""
        ...


def provision_nodes(compute: Compute, nodes: Sequence[Node]) -> None:
    """Ask for the machines of ``nodes``: in one call where ``compute`` takes a batch
    (:class:`BatchProvisioning`), else one call per node, in order. Idempotent by node, as
    ``provision_node`` is."""
    if not nodes:
        return
    if isinstance(compute, BatchProvisioning):
        compute.provision_nodes(nodes)
        return
    for node in nodes:
        compute.provision_node(node)
