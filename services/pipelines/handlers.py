"""Pipelines: when a training pipeline's job succeeds, upload its model into the registry.

The API writes a pipeline's record and a link from its backing job (``training_pipeline_jobs/
{domain job id}``) in the transaction that submits the job; this handler, on the job's
``JobFinished``, uploads ``modelToUpload`` from the job's ``AIP_MODEL_DIR`` (the artifactUri)
as a new model or a new version of ``parentModel``, with the job's lineage, and records the
result on the pipeline. Nobody has to poll for it. Idempotent: a pipeline whose upload is
recorded is left alone, and the model id is derived from the pipeline, so a redelivered
event uploads nothing twice.
"""

from __future__ import annotations

from typing import Any

from services.pipelines import registry
from shared.domain.errors import MtcError
from shared.domain.events import JobFinished
from shared.domain.model import JobState
from shared.handling import Deps

SERVICE = "pipelines"
PIPELINE_JOBS = "training_pipeline_jobs"  # domain job id -> {"pipeline": the pipeline's id}
RESOURCES = "api_resources"
PIPELINE_KIND = "trainingPipeline"


def pipeline_key(pipeline_id: str) -> str:
    return f"{PIPELINE_KIND}:{pipeline_id}"


def on_job_finished(event: JobFinished, uow: Any, deps: Deps) -> None:
    # uow: a DocUnitOfWork (the records API is not part of the UnitOfWork protocol)
    link = uow.record(PIPELINE_JOBS, event.job_id)
    if link is None:
        return  # not a pipeline's job
    record = uow.record(RESOURCES, pipeline_key(link["pipeline"]))
    if record is None or record.get("upload") is not None:
        return  # deleted, or uploaded already (a redelivery)
    job = uow.jobs.get(event.job_id)
    if job is None or job.state is not JobState.SUCCEEDED:
        return  # the pipeline's state follows the job's; nothing to upload
    model = (record["resource"] or {}).get("modelToUpload")
    if not model:
        return
    upload(uow, record, job, deps.clock.now(), deps)


def upload(uow: Any, record: dict[str, Any], job: Any, now: float, deps: Deps) -> None:
    resource = record["resource"]
    parent = record["parent"]
    job_key = f"customJob:{record['job_id']}"
    job_record = uow.record(RESOURCES, job_key)
    job_resource = job_record["resource"] if job_record else {}
    model = dict(resource["modelToUpload"])
    model.setdefault("artifactUri",
                     registry.model_dir(job_resource, deps.config.output_root, job.job_id))
    pipeline_name = f"{parent}/trainingPipelines/{record['id']}"
    model["trainingPipeline"] = pipeline_name
    parent_model = record.get("parent_model_id")
    model_id = parent_model or resource.get("modelId") or registry.new_model_id(
        "pipeline", parent, record["id"])
    lineage = registry.lineage(job, f"{parent}/customJobs/{record['job_id']}", job_resource,
                               pipeline_name)
    try:
        version = registry.add_version(uow, parent=parent, model_id=model_id,
                                       new_model=parent_model is None, model=model,
                                       lineage=lineage,
                                       job_key=job_key if job_record else None, now=now)
    except MtcError as exc:  # the parent model was deleted, the model id taken meanwhile
        outcome: dict[str, Any] = {"error": str(exc), "time": now}
    else:
        outcome = {"model": registry.model_name(parent, model_id),
                   "versionId": version["version_id"], "time": now}
    uow.put_record(RESOURCES, pipeline_key(record["id"]), {**record, "upload": outcome})


SUBSCRIPTIONS = {
    JobFinished: on_job_finished,
}
