"""CustomJobs: create, get, list, cancel, delete, in Vertex AI's v1 shapes.

The wire message is parsed strictly (unknown fields refused), then turned into the domain's
job spec, which validates meaning (machines that fit the cluster, one program per pool). A
job runs on the cluster its ``jobSpec.persistentResourceId`` names, in the same project.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from services.api import buckets, ids, job_listing
from services.api import operations as ops
from services.api.collection import Collection, Scope, new_id, prior_create, require_cluster
from services.api.context import (
    RESOURCES,
    ApiContext,
    create_id,
    find_record,
    load_record,
    records_of,
    resource_key,
    save_record,
)
from services.api.errors import ApiError, invalid, not_found
from services.api.job_listing import KIND as KIND  # (these four: known from here too)
from services.api.job_listing import Listed
from services.api.job_listing import adopted_record as adopted_record
from services.api.job_listing import domain_job_id as domain_job_id
from services.api.job_listing import job_of as job_of
from services.api.names import Parent, resource_id
from services.api.wire.custom_job import CustomJob, ListCustomJobsResponse
from services.api.wire.proto_json import timestamp
from services.api.wiremodel import parse_message
from services.job_submission import commands as job_commands
from shared.domain.adopted import adopted, may_be_adopted
from shared.domain.model import Job, JobState

COLLECTION = "customJobs"
FILTERABLE = ("state", "displayName", "createTime")
GCS_URI = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/[^\x00-\x1f]*)?$")
Shown = tuple[Job, dict[str, Any]]  # a job and its API record: what a GET renders
_SCHEDULING_EXTENSIONS = {"mtcPartition": "partition", "mtcPriority": "priority",
                          "mtcMaxRestarts": "maxRestarts"}


def create(ctx: ApiContext, parent: Parent, body: Any, job_id: str | None = None,
           generated: str | None = None) -> dict[str, Any]:
    message = parse_message(CustomJob, body)
    spec_body, cluster_id = domain_body(message)
    if job_id is not None:
        resource_id(job_id, "customJobId")
    with ctx.unit() as uow:
        cluster = require_cluster(uow, parent, cluster_id, "jobSpec.persistentResourceId")
        named = buckets.job_uris(message.to_json().get("jobSpec"), "jobSpec")
        buckets.claim(uow, parent, named, ctx.now)
        job_id = job_id or generated or new_id()
        existing = prior_create(uow, KIND, job_id, parent, parent.child(COLLECTION, job_id),
                                _stored(message), ctx.now)
        job = job_commands.submit_job(cluster, spec_body, uow, ctx.runtime.deps,
                                      domain_job_id(create_id(uow, KIND, job_id, parent,
                                                              ctx.now)))
        buckets.check_packages(ctx.storage_root, named)  # after the spec's own checks
        if existing is None:
            save_record(uow, KIND, job_id, parent, _stored(message), ctx.now)
        record = {"resource": _stored(message), "parent": parent.name}
        return render(job, parent, job_id, record)


def delete(ctx: ApiContext, parent: Parent, job_id: str) -> dict[str, Any]:
    """Deleting a job that still runs is refused: cancel it first (as Vertex does)."""
    ctx.refresh()
    with ctx.unit() as uow:
        record = load_record(uow, KIND, job_id, parent, parent.child(COLLECTION, job_id))
        job = uow.jobs.get(job_of(record))
        if job is not None and not job.terminal:
            raise ApiError("FAILED_PRECONDITION", f"custom job {job_id} is {job.state.value}: "
                           "cancel it and wait for JOB_STATE_CANCELLED before deleting it")
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=ids.domain_of(record),
                                               verb="delete",
                                               generation=int(record["created"] * 1e6))
        uow.delete_record(RESOURCES, resource_key(KIND, ids.domain_of(record)))
        uow.delete_record("jobs", job_of(record))
        return ops.render(uow, op, ctx.now)


# ---------------------------------------------------------------- conversion


def domain_body(message: CustomJob) -> tuple[dict[str, Any], str]:
    """The domain's job body and the cluster it runs on; refuses what mtc cannot do."""
    spec = message.job_spec
    if spec is None:
        raise invalid("jobSpec", "is required")
    if not spec.persistent_resource_id:
        raise invalid("jobSpec.persistentResourceId", "is required: name the cluster "
                      "(a modelDevelopmentCluster id) the job runs on")
    if not message.display_name:
        raise invalid("displayName", "is required")
    wire = message.to_json()["jobSpec"]
    pools = []
    for i, pool in enumerate(wire.get("workerPoolSpecs", [])):
        container = pool.get("containerSpec")
        if container is not None and not container.get("command"):
            raise invalid(f"jobSpec.workerPoolSpecs[{i}].containerSpec.command",
                          "is required here: mtc runs a command on the cluster's nodes and "
                          "cannot pull and run a container image by itself")
        machine = dict(pool.get("machineSpec") or {})
        if machine.get("acceleratorType") == "ACCELERATOR_TYPE_UNSPECIFIED":
            machine.pop("acceleratorType")
        if "replicaCount" in pool:
            pool = {**pool, "replicaCount": int(pool["replicaCount"])}
        if i == 0 and pool.get("replicaCount", 1) != 1:
            raise invalid("jobSpec.workerPoolSpecs[0].replicaCount",
                          "must be 1: pool 0 is the primary replica, exactly one, as Vertex "
                          f"requires; put the other replicas in workerPoolSpecs[1] (got "
                          f"{pool['replicaCount']})")
        pools.append({**pool, "machineSpec": machine} if pool.get("machineSpec") else pool)
    scheduling = dict(wire.get("scheduling") or {})
    for ext, key in _SCHEDULING_EXTENSIONS.items():
        if ext in scheduling:
            scheduling[key] = scheduling.pop(ext)
    if scheduling.pop("disableRetries", False):
        scheduling["maxRestarts"] = 0
    if scheduling.get("strategy") == "STRATEGY_UNSPECIFIED":
        scheduling.pop("strategy")
    job_spec: dict[str, Any] = {"workerPoolSpecs": pools, "scheduling": scheduling}
    out_dir = wire.get("baseOutputDirectory")
    if out_dir:
        uri = out_dir["outputUriPrefix"]
        _check_output_uri(uri)
        job_spec["baseOutputDirectory"] = out_dir
    body = {"displayName": message.display_name, "jobSpec": job_spec,
            "labels": dict(message.labels)}
    return body, spec.persistent_resource_id


def _check_output_uri(uri: str) -> None:
    where = "jobSpec.baseOutputDirectory.outputUriPrefix"
    match = GCS_URI.fullmatch(uri)  # match: "$" lets a trailing newline by
    if not match:
        raise invalid(where, "must be a Cloud Storage URI, gs://BUCKET/PATH")
    path = match.group(2) or ""
    if any(part in (".", "..") for part in path.split("/")):
        raise invalid(where, "must not contain '.' or '..' path segments")


def _stored(message: CustomJob) -> dict[str, Any]:
    """The job's input fields as the caller gave them, normalized: what GET returns."""
    keep = {"displayName", "jobSpec", "labels"}
    return {k: v for k, v in message.to_json().items() if k in keep}


def render(job: Job, parent: Parent, job_id: str, record: dict[str, Any]) -> dict[str, Any]:
    resource = dict(record["resource"])
    out: dict[str, Any] = {
        "name": parent.child(COLLECTION, job_id),
        **resource,
        "state": job.state.value,
        "createTime": timestamp(job.created_at),
        "updateTime": timestamp(job.updated_at),
    }
    if job.started_at is not None:
        out["startTime"] = timestamp(job.started_at)
    if job.ended_at is not None:
        out["endTime"] = timestamp(job.ended_at)
    if job.state is JobState.FAILED:
        code = 4 if "timeout" in job.error or "deadline" in job.error else 13
        out["error"] = {"code": code, "message": job.error or "the job failed"}
    elif job.state is JobState.CANCELLED:
        out["error"] = {"code": 1, "message": "CANCELED"}
    latest = job.latest_checkpoint
    cluster = _cluster_of(record, job)
    out["mtcProgress"] = {
        "clusterId": cluster, "attempt": job.attempt,
        "restartCount": job.restart_count,
        "nodes": [ids.api_node(job.cluster_id, cluster, n) for n in job.node_ids if n],
        **({"latestCheckpoint": {"step": str(latest.step), "path": latest.path,
                                 "time": timestamp(latest.at)}} if latest else {}),
    }
    advice = job.checkpoint_advice
    if advice:  # checkpoint_resume's advice (shared.policies.checkpointing.advise)
        out["mtcProgress"]["checkpointAdvice"] = {
            "intervalSeconds": advice["interval_s"], "mtbfSeconds": advice["mtbf_s"],
            "saveSeconds": advice["save_s"], "interruptions": advice["interruptions"],
            "basis": advice["basis"], "time": timestamp(advice["at"])}
    if job.recovery.decisions:  # checkpoint_resume's recovery choices (services/.../modes.py)
        out["mtcProgress"]["recovery"] = [
            {"attempt": d["attempt"], "mode": d["mode"], "incident": d["incident"],
             "why": d["why"], "expectedLostSeconds": d["expected_lost_s"],
             "measuredSeconds": d.get("measured_s"), "time": timestamp(d["at"])}
            for d in job.recovery.decisions]
    if job.queue and job.state in (JobState.QUEUED, JobState.PENDING):  # team queues
        out["mtcProgress"]["queue"] = dict(job.queue)
    if record.get("models"):  # the registry's versions uploaded from it (services/pipelines)
        out["mtcModels"] = list(record["models"])
    return CustomJob.model_validate(out).to_json()


def _cluster_of(record: dict[str, Any], job: Job) -> str:
    """The API id of the job's cluster: the one its body names (an adopted job's record
    carries it), not the domain's (``services.api.ids``)."""
    spec = record["resource"].get("jobSpec") or {}
    return str(spec.get("persistentResourceId") or record.get("cluster") or job.cluster_id)


def _listed(scope: Scope) -> Iterator[Listed]:
    """Every job of the parent in list order (``job_listing.seek``, a page at a time)."""
    after = None
    while rows := job_listing.seek(scope, after, 500, []):
        yield from (item for _, item in rows if item is not None)
        after = rows[-1][0]


def _render(scope: Scope, shown: Listed) -> dict[str, Any] | None:
    job, record = shown
    job = job or scope.uow.jobs.get(job_of(record))
    return None if job is None else render(job, scope.parent, record["id"], record)


def _found(scope: Scope, job_id: str) -> Shown:
    """The job and its record. Nothing of another project is read on the way (its parent,
    or its cluster's, is compared first): a job id another project has costs what one no
    one has does, so no timing tells it exists."""
    uow, parent = scope.uow, scope.parent
    name = parent.child(COLLECTION, job_id)
    record = find_record(uow, KIND, job_id, parent)
    if record is not None:
        job = uow.jobs.get(job_of(record))
        if job is None:
            raise not_found(name)
        return job, record
    if may_be_adopted(job_id):  # shown under the parent of the cluster it runs on
        for cluster in records_of(uow, "cluster", parent):
            job = uow.jobs.get_on(ids.domain_of(cluster), job_id)
            if job is not None and adopted(job.spec):
                return job, adopted_record(job, cluster["id"])
    raise not_found(name)


def _cancel(scope: Scope, job_id: str, shown: Listed) -> None:
    """Refused once the job has ended (as the pipelines' cancel is), naming its state."""
    job, record = shown
    assert job is not None  # found (``_found``), not listed
    if job.terminal:
        state = render(job, scope.parent, record["id"], record)["state"]
        raise ApiError("FAILED_PRECONDITION", f"custom job {job_id} is {state}: only a job "
                       "that has not ended can be cancelled")
    job_commands.cancel_job(job.job_id, scope.uow, scope.ctx.runtime.deps)


JOBS: Collection[Listed] = Collection(
    ListCustomJobsResponse, "custom_jobs", CustomJob, load=_listed, render=_render,
    filterable=FILTERABLE, seek=job_listing.seek, find=_found, stop=_cancel,
    create=create, id_param="customJobId", remove=delete)
get, list_jobs, cancel = JOBS.get, JOBS.list_page, JOBS.cancel
