"""Job submission's user commands: clusters and jobs, as the API and the CLI ask for them.

Each command validates, writes the desired state and emits an event in the caller's unit of
work; the services converge on it (``handlers``). One argument order for every command, the
order of a handler's ``(event, uow, deps)``: what is asked first, then the unit of work, then
the dependencies (only where the command needs them), then what is optional. Importers name
this module ``job_commands``.
"""

from __future__ import annotations

import uuid
from typing import Any

from services.job_submission.scheduling import free_held_nodes
from shared.domain.adopted import RESERVED_LABELS
from shared.domain.errors import Conflict, NotFound, ValidationError
from shared.domain.events import (
    ClusterCreateRequested,
    ClusterDeleteRequested,
    ClusterUpdateRequested,
    JobCancelRequested,
    JobSubmitted,
)
from shared.domain.model import Cluster, ClusterState, Job, JobState
from shared.domain.specs import ID_PATTERN, ClusterSpec, CustomJobSpec, MachineSpec
from shared.handling import Deps
from shared.policies import job_limits, preflight, recovery
from shared.ports import UnitOfWork
from shared.service_layer import gangs

# ---------------------------------------------------------------- clusters


def create_cluster(body: Any, uow: UnitOfWork, deps: Deps) -> Cluster:
    spec = ClusterSpec.parse(body)
    for name, message in recovery.label_errors(dict(spec.labels)):
        raise ValidationError(name, message)
    preflight.plan_for(spec.labels)  # the mode and floor labels: a 400 naming the label
    now = deps.clock.now()
    existing = uow.clusters.get(spec.cluster_id)
    if existing is not None and existing.state is not ClusterState.DELETED:
        if existing.spec == spec:
            return existing  # a retried create with the same spec: same answer
        raise Conflict(f"cluster {spec.cluster_id} already exists")
    generation = existing.generation + 1 if existing else 1
    cluster = Cluster(spec.cluster_id, spec, ClusterState.PROVISIONING, now, now, generation)
    uow.clusters.add(cluster)
    uow.emit(ClusterCreateRequested(cluster_id=spec.cluster_id, generation=generation))
    return cluster


def get_cluster(cluster_id: str, uow: UnitOfWork) -> Cluster:
    cluster = uow.clusters.get(cluster_id)
    if cluster is None or cluster.state is ClusterState.DELETED:
        raise NotFound("cluster", cluster_id)
    return cluster


def list_clusters(uow: UnitOfWork) -> list[Cluster]:
    return sorted((c for c in uow.clusters.list() if c.state is not ClusterState.DELETED),
                  key=lambda c: c.cluster_id)


def update_cluster(cluster_id: str, body: Any, uow: UnitOfWork, deps: Deps) -> Cluster:
    cluster = get_cluster(cluster_id, uow)
    if isinstance(body, dict) and "clusterId" not in body:
        body = {**body, "clusterId": cluster_id}
    spec = ClusterSpec.parse(body)
    if spec.cluster_id != cluster_id:
        raise ValidationError("clusterId", f"cannot change the cluster id ({cluster_id})")
    for name, message in recovery.label_errors(dict(spec.labels)):
        raise ValidationError(name, message)
    preflight.plan_for(spec.labels)  # the mode and floor labels: a 400 naming the label
    if spec == cluster.spec:
        return cluster
    for pool in cluster.spec.node_pools:
        new = next((p for p in spec.node_pools if p.pool_id == pool.pool_id), None)
        if new is not None and new.machine_spec != pool.machine_spec:
            i = spec.node_pools.index(new)
            raise ValidationError(f"nodePools[{i}].machineSpec",
                                  "cannot change the machine of an existing pool; add a pool")
    cluster.transition(ClusterState.UPDATING, deps.clock.now(), "update requested")
    cluster.spec = spec
    cluster.generation += 1
    uow.emit(ClusterUpdateRequested(cluster_id=cluster_id, generation=cluster.generation))
    return cluster


def delete_cluster(cluster_id: str, uow: UnitOfWork, deps: Deps) -> Cluster:
    cluster = get_cluster(cluster_id, uow)
    if cluster.state is not ClusterState.DELETING:
        cluster.transition(ClusterState.DELETING, deps.clock.now(), "delete requested")
        uow.emit(ClusterDeleteRequested(cluster_id=cluster_id))
    return cluster


# ---------------------------------------------------------------- jobs


def submit_job(cluster_id: str, body: Any, uow: UnitOfWork, deps: Deps,
               job_id: str | None = None) -> Job:
    cluster = get_cluster(cluster_id, uow)
    if cluster.state in (ClusterState.DELETING, ClusterState.FAILED):
        raise Conflict(f"cluster {cluster_id} is {cluster.state.value}: it takes no jobs")
    spec = CustomJobSpec.parse(body)
    for key in RESERVED_LABELS & {k for k, _ in spec.labels}:
        raise ValidationError(f"labels.{key}", "is set by mtc on the jobs it adopts")
    if job_id is not None and not ID_PATTERN.match(job_id):
        raise ValidationError("jobId", "must be lowercase letters, digits and hyphens")
    _check_recovery_labels(spec)
    check_fits(cluster, spec)
    job_id = job_id or f"job-{uuid.uuid4().hex[:10]}"
    existing = uow.jobs.get(job_id)
    if existing is not None:
        if existing.spec == spec and existing.cluster_id == cluster_id:
            return existing
        raise Conflict(f"job {job_id} already exists")
    now = deps.clock.now()
    job = Job(job_id, cluster_id, spec, JobState.QUEUED, now, now,
              priority=spec.scheduling.priority)
    uow.jobs.add(job)
    uow.emit(JobSubmitted(job_id=job_id, cluster_id=cluster_id))
    return job


def _check_recovery_labels(spec: CustomJobSpec) -> None:
    """``mtc-recovery-mode`` names a mode; ``mtc-min-replicas`` is below the elastic pool's
    replicas (``shared.service_layer.gangs.elastic_pool``)."""
    labels = dict(spec.labels)
    for name, message in [*recovery.label_errors(labels), *job_limits.label_errors(labels)]:
        raise ValidationError(name, message)
    low = recovery.min_replicas(labels)
    if low is not None:
        pool = spec.worker_pool_specs[gangs.elastic_pool(spec)]
        if low > pool.replica_count:
            raise ValidationError(f"labels.{recovery.MIN_REPLICAS_LABEL}",
                                  f"{low} is more than the data-parallel pool's "
                                  f"{pool.replica_count} replicas")


def check_fits(cluster: Cluster, spec: CustomJobSpec) -> None:
    """Reject at submit time what could never run, instead of leaving it pending forever."""
    partitions = {p.name: p for p in cluster.spec.partitions}
    wanted = spec.scheduling.partition
    if wanted is not None and wanted not in partitions:
        raise ValidationError("jobSpec.scheduling.partition",
                              f"cluster {cluster.cluster_id} has no partition {wanted!r}; "
                              f"it has {sorted(partitions)}")
    for i, pool_spec in enumerate(spec.worker_pool_specs):
        pools = [p for p in cluster.spec.node_pools if p.machine_spec == pool_spec.machine_spec
                 and (wanted is None or p.pool_id in partitions[wanted].node_pool_ids)]
        path = f"jobSpec.workerPoolSpecs[{i}]"
        if not pools:
            raise _no_pool(cluster, pool_spec.machine_spec, path, wanted)
        capacity = sum(p.node_count for p in pools)
        # worker pools of one machine type share its nodes (pool 0 and pool 1 of Vertex's
        # layout usually do): count them together, up to this one
        needed = sum(w.replica_count for w in spec.worker_pool_specs[:i + 1]
                     if w.machine_spec == pool_spec.machine_spec)
        if needed > capacity:
            shared = "" if needed == pool_spec.replica_count else \
                " (with the earlier worker pools of this machine type)"
            raise ValidationError(f"{path}.replicaCount",
                                  f"needs {needed} nodes{shared}; matching pools "
                                  f"have {capacity}")


def _no_pool(cluster: Cluster, wanted: MachineSpec, path: str, partition: str | None
             ) -> ValidationError:
    """No pool of ``cluster`` (in ``partition``) has ``wanted``: the error names the field
    that differs (the machine type, else the accelerators) and lists what is offered."""
    names = {p.name: set(p.node_pool_ids) for p in cluster.spec.partitions}
    offered = sorted({_spec_text(p.machine_spec) for p in cluster.spec.node_pools
                      if partition is None or p.pool_id in names[partition]})
    types = {p.machine_spec.machine_type for p in cluster.spec.node_pools}
    field = "machineSpec" if wanted.machine_type in types else "machineSpec.machineType"
    where = f"cluster {cluster.cluster_id}" + (f" partition {partition!r}" if partition else "")
    return ValidationError(f"{path}.{field}", f"{where} offers no {_spec_text(wanted)}; "
                           f"it offers: {', '.join(offered) or 'no worker pools'}")


def _spec_text(spec: MachineSpec) -> str:
    accel = f" with {spec.accelerator_count} x {spec.accelerator_type}" \
        if spec.accelerator_type else ""
    return f"{spec.machine_type}{accel}"


def get_job(job_id: str, uow: UnitOfWork) -> Job:
    job = uow.jobs.get(job_id)
    if job is None:
        raise NotFound("job", job_id)
    return job


def list_jobs(cluster_id: str | None, uow: UnitOfWork) -> list[Job]:
    return sorted(uow.jobs.list(cluster_id), key=lambda j: (j.created_at, j.job_id))


def cancel_job(job_id: str, uow: UnitOfWork, deps: Deps) -> Job:
    job = get_job(job_id, uow)
    now = deps.clock.now()
    if job.terminal or job.state is JobState.CANCELLING:
        return job
    if job.state is JobState.RUNNING:
        # the workers are signalled by the event's handler, after this commits: a cancel that
        # loses its transaction must not have stopped them (they would end as a failure)
        job.transition(JobState.CANCELLING, now)
    else:
        free_held_nodes(job, uow, deps)
        job.transition(JobState.CANCELLED, now)
    uow.emit(JobCancelRequested(job_id=job_id))
    return job
