"""An attempt's start: the gang it runs as, and starting it on the job's nodes.

Scheduling starts a placed (or resumed) job here, and checkpoint_resume starts the next
attempt of a running job here when a recovery skips the queue (in place, hot swap, scale
down: ``services.checkpoint_resume.modes``): one path, so an attempt started either way
is the same attempt.

An elastic job (label ``mtc-min-replicas``) may run an attempt with fewer replicas of its
data-parallel pool (``elastic_pool``: its largest pool) than its spec asks:
``Job.recovery.replicas`` says how many, and the gang's ranks and WORLD_SIZE follow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from mtc_program.protocol import RESTORE_SKIP
from shared.domain import lifecycle, progress, ranks
from shared.domain.cluster_storage import STORAGE_MOUNTS
from shared.domain.events import JobStarted
from shared.domain.model import Job, JobState
from shared.domain.specs import CustomJobSpec
from shared.handling import Deps
from shared.policies import job_limits
from shared.ports import Gang, LaunchGroup, RecoveryPlan, UnitOfWork
from shared.service_layer import active_checks
from shared.service_layer.pool_commands import gcs_bucket, pool_command


def elastic_pool(spec: CustomJobSpec) -> int:
    """The data-parallel pool an elastic job shrinks: its largest (the last on a tie)."""
    counts = [p.replica_count for p in spec.worker_pool_specs]
    return max(range(len(counts)), key=lambda i: (counts[i], i))


def pool_counts(job: Job) -> list[int]:
    """The replicas per pool this attempt runs: the spec's, the elastic pool's lowered while
    the job is scaled down."""
    counts = [p.replica_count for p in job.spec.worker_pool_specs]
    if job.recovery.replicas is not None:
        counts[elastic_pool(job.spec)] = job.recovery.replicas
    return counts


def pool_range(job: Job, pool: int) -> range:
    """The ranks of ``pool`` in this attempt's numbering."""
    counts = pool_counts(job)
    first = sum(counts[:pool])
    return range(first, first + counts[pool])


def shrink(job: Job, gone: set[str]) -> None:
    """Scale down: the ranks on ``gone`` (all in the elastic pool) leave; the ranks after
    them move up, the elastic pool runs with that many fewer replicas."""
    kept = [n for n in job.node_ids if n not in gone]
    dropped = len(job.node_ids) - len(kept)
    job.recovery.replicas = pool_counts(job)[elastic_pool(job.spec)] - dropped
    job.node_ids = ranks.as_ranks(kept)


def regrow(job: Job) -> int:
    """Back to the spec's size: holes at the end of the elastic pool for placement (or a
    spare) to fill. Returns how many; none when the job is not scaled down."""
    if job.recovery.replicas is None:
        return 0
    pool = elastic_pool(job.spec)
    end = pool_range(job, pool).stop
    missing = job.spec.worker_pool_specs[pool].replica_count - job.recovery.replicas
    held = list(job.node_ids)
    job.node_ids = ranks.as_ranks(held[:end] + [""] * missing + held[end:])
    job.recovery.replicas = None
    return missing


def start_attempt(job: Job, placed: list[str], uow: UnitOfWork, deps: Deps,
                  plan: RecoveryPlan | None = None) -> Gang:
    """Start the job's next attempt: ``placed`` fill its holes (rank order), the job is
    RUNNING (it stays so when a recovery restarts it without a requeue), its workers start
    and ``JobStarted`` says so. ``plan``: how a recovery started it (None: a placement)."""
    now = deps.clock.now()
    job.node_ids = ranks.fill_holes(job.node_ids if job.node_ids
                                    else ("",) * sum(pool_counts(job)), placed)
    if job.state is not JobState.RUNNING:
        job.transition(JobState.RUNNING, now)
    job.attempt += 1
    job.started_at = job.started_at or now
    job.recovery.not_before = None
    job.recovery.excluded_node_ids = []  # suspects are kept out of one placement: this one
    job.recovery.attempt_started_at = now
    job.recovery.attempt_mode = plan.mode if plan is not None else ""
    progress.started(job, now)
    for node_id in placed:
        node = uow.nodes.get(node_id)
        assert node is not None, f"placed on {node_id}, which is gone"
        active_checks.yield_to_job(node, deps)  # a check on it never delays the job
        lifecycle.assign_to_job(node, job.job_id, now)
    cluster = uow.clusters.get(job.cluster_id)
    storage = cluster.spec.storage if cluster is not None else None
    mounts = storage.mounts(deps.config.output_root, job.cluster_id) if storage else {}
    workers = gang(job, deps, plan, mounts)
    deps.compute.start_workers(workers)
    latest = job.latest_checkpoint
    uow.emit(JobStarted(job_id=job.job_id, attempt=job.attempt, node_ids=workers.node_ids,
                        resume_step=latest.step if latest else -1))
    early = job.recovery.take_early_exit(job.job_id, job.attempt)
    if early is not None:  # the attempt already ran and exited before this commit
        uow.emit(early)
    return workers


def output_dirs(job: Job, deps: Deps) -> tuple[str, str, str]:
    """The managed-training layout under baseOutputDirectory: checkpoints/, model/, logs/.
    A ``gs://BUCKET/PATH`` prefix lands under the output root (``<root>/gcs/BUCKET/PATH``):
    the API admits nothing else, so outputs never leave the configured root."""
    base = local_output_dir(job.spec.base_output_directory, deps.config.output_root, job.job_id)
    return f"{base}/checkpoints", f"{base}/model", f"{base}/logs"


def local_output_dir(uri: str | None, root: Path, job_id: str) -> str:
    if not uri:
        return str(root / job_id)
    if uri.startswith("gs://"):
        parts = [p for p in uri.removeprefix("gs://").split("/") if p not in ("", ".", "..")]
        return str(root.joinpath("gcs", *parts))
    return uri.removeprefix("file://").rstrip("/")  # the twin's sim:// names, tests' own paths


def gang(job: Job, deps: Deps, plan: RecoveryPlan | None = None,
         mounts: Mapping[str, str] | None = None) -> Gang:
    """The attempt's one start request: a launch group per pool, ranks pool after pool.
    ``mounts``: the cluster's storage, the path a job sees -> the directory that holds it
    (``ClusterStorage.mounts``), told to every rank in ``MTC_STORAGE_MOUNTS``."""
    ckpt, model, logs = output_dirs(job, deps)
    node_ids = tuple(job.node_ids)
    groups: list[LaunchGroup] = []
    first = 0
    for pool, n in zip(job.spec.worker_pool_specs, pool_counts(job), strict=True):
        command, env = pool_command(pool, deps)
        if job.recovery.restore_skip:  # the escalation ladder's rung (MTC_RESTORE_SKIP)
            env = (*env, (RESTORE_SKIP, ",".join(job.recovery.restore_skip)))
        # the service's own variable: a spec's is dropped (it must not name mounts)
        env = tuple(kv for kv in env if kv[0] != STORAGE_MOUNTS)
        if mounts:
            env = (*env, (STORAGE_MOUNTS, json.dumps(dict(mounts), sort_keys=True)))
        if n < 1:
            continue  # (an elastic pool is never shrunk below its minimum, at least 1)
        if len(node_ids) < first + n:
            raise ValueError(f"job {job.job_id}: {len(node_ids)} nodes for {first + n} ranks")
        node = job_limits.node_limits(pool.machine_spec.machine_type, dict(job.spec.labels))
        groups.append(LaunchGroup(first, n, command, env, (node.processes, node.memory_bytes)))
        first += n
    # node_ids[:first] is node_ids itself (one tuple, shared with JobStarted) unless the job
    # holds more nodes than ranks
    return Gang(job.job_id, job.attempt, node_ids[:first], tuple(groups), ckpt, model, logs,
                plan, buckets(job.spec))


def buckets(spec: CustomJobSpec) -> tuple[str, ...]:
    """The ``gs://`` buckets a job's spec names (its output, its packages): the API admitted
    each as its project's, so these are the buckets its workers may read packages from."""
    uris = [spec.base_output_directory or ""]
    for pool in spec.worker_pool_specs:
        if pool.python_package_spec is not None:
            uris += pool.python_package_spec.package_uris
    return tuple(dict.fromkeys(b for b in map(gcs_bucket, uris) if b))
