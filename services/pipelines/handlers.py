"""Pipelines: when a training pipeline's job succeeds, upload its model into the registry.

The API writes a pipeline's record and a link from its backing job (``training_pipeline_jobs/
{domain job id}``) in the transaction that submits the job; this handler, on the job's
``JobFinished``, uploads ``modelToUpload`` from the job's ``AIP_MODEL_DIR`` (the artifactUri)
as a new model or a new version of ``parentModel``, with the job's lineage, and records the
result on the pipeline. Nobody has to poll for it. Idempotent: a pipeline whose upload is
recorded is left alone, and the model id is derived from the pipeline, so a redelivered
event uploads nothing twice.

A hyperparameter-tuning-task pipeline runs a tuning job instead (link ``training_pipeline_
studies/{study id}``); on the tuning service's ``TuningJobEnded`` with SUCCEEDED, the model
is uploaded from the best trial's ``AIP_MODEL_DIR`` (best by the study's first metric and its
goal), its lineage naming that trial's job, attempt and checkpoint and the tuning job.
"""

from __future__ import annotations

from typing import Any

from services.pipelines import registry
from shared.domain.errors import MtcError
from shared.domain.events import JobFinished, TuningJobEnded
from shared.domain.model import JobState
from shared.handling import Deps

SERVICE = "pipelines"
PIPELINE_JOBS = "training_pipeline_jobs"  # domain job id -> {"pipeline": its domain id}
PIPELINE_STUDIES = "training_pipeline_studies"  # tuning study id -> {"pipeline": ...}
STUDIES = "tuning_studies"  # the tuning service's study records (services.tuning.handlers)
RESOURCES = "api_resources"
PIPELINE_KIND = "trainingPipeline"


def pipeline_key(pipeline_id: str) -> str:
    """``pipeline_id``: the pipeline's domain id (services.api.ids; a record's ``domain``)."""
    return f"{PIPELINE_KIND}:{pipeline_id}"


def _key_of(record: dict[str, Any]) -> str:
    return pipeline_key(str(record.get("domain") or record["id"]))


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


def on_tuning_job_ended(event: TuningJobEnded, uow: Any, deps: Deps) -> None:
    link = uow.record(PIPELINE_STUDIES, event.study_id)
    if link is None:
        return  # not a pipeline's tuning job
    record = uow.record(RESOURCES, pipeline_key(link["pipeline"]))
    if record is None or record.get("upload") is not None:
        return  # deleted, or uploaded already (a redelivery)
    study = uow.record(STUDIES, event.study_id)
    if study is None or study["state"] != "JOB_STATE_SUCCEEDED":
        return  # failed or cancelled: the pipeline's state follows the study's
    if not (record["resource"] or {}).get("modelToUpload"):
        return
    trial = best_trial(study)
    job = uow.jobs.get(trial["job_id"]) if trial is not None else None
    now = deps.clock.now()
    if trial is None or job is None:
        uow.put_record(RESOURCES, _key_of(record), {
            **record, "upload": {"error": "no succeeded trial with a final measurement "
                                 "(or its custom job is gone)", "time": now}})
        return
    tuning_job = f"{record['parent']}/hyperparameterTuningJobs/{event.study_id}"
    upload(uow, record, job, now, deps, api_job_id=trial["api_job_id"],
           extra={"tuningJob": tuning_job, "trial": trial["id"]})


def best_trial(study: dict[str, Any]) -> dict[str, Any] | None:
    """The SUCCEEDED trial with the best final value of the study's first metric."""
    metrics = (study["body"].get("studySpec") or {}).get("metrics") or [{}]
    maximize = str(metrics[0].get("goal", "")).upper() in ("MAXIMIZE", "1")
    done = [t for t in study["trials"] if t["state"] == "SUCCEEDED" and t.get("final")]
    if not done:
        return None
    key = (lambda t: float(t["final"][1])) if maximize else (lambda t: -float(t["final"][1]))
    best: dict[str, Any] = max(done, key=key)
    return best


def upload(uow: Any, record: dict[str, Any], job: Any, now: float, deps: Deps, *,
           api_job_id: str | None = None, extra: dict[str, Any] | None = None) -> None:
    resource = record["resource"]
    parent = record["parent"]
    api_job_id = api_job_id or record["job_id"]
    job_key = f"customJob:{api_job_id}"
    job_record = uow.record(RESOURCES, job_key)
    job_resource = job_record["resource"] if job_record else {}
    model = dict(resource["modelToUpload"])
    model.setdefault("artifactUri",
                     registry.model_dir(job_resource, deps.config.output_root, job.job_id))
    pipeline_name = f"{parent}/trainingPipelines/{record['id']}"
    model["trainingPipeline"] = pipeline_name
    parent_model = record.get("parent_model_id")  # the registry's ids (services.api.ids)
    name_id = None if parent_model else resource.get("modelId")
    model_id = parent_model or record.get("model_key") or name_id or registry.new_model_id(
        "pipeline", parent, record["id"])
    lineage = {**registry.lineage(job, f"{parent}/customJobs/{api_job_id}", job_resource,
                                  pipeline_name), **(extra or {})}
    try:
        version = registry.add_version(uow, parent=parent, model_id=model_id,
                                       new_model=parent_model is None, model=model,
                                       lineage=lineage,
                                       job_key=job_key if job_record else None, now=now,
                                       name_id=name_id)
    except MtcError as exc:  # the parent model was deleted, the model id taken meanwhile
        outcome: dict[str, Any] = {"error": str(exc), "time": now}
    else:
        outcome = {"model": registry.model_name(parent, registry.shown(version)),
                   "versionId": version["version_id"], "time": now}
    uow.put_record(RESOURCES, _key_of(record), {**record, "upload": outcome})


SUBSCRIPTIONS = {
    JobFinished: on_job_finished,
    TuningJobEnded: on_tuning_job_ended,
}
