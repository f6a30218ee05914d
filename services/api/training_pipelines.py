"""TrainingPipelines (v1): a custom training task run as a CustomJob, its model uploaded
into the registry when the job succeeds.

``trainingTaskInputs`` of the custom task is a CustomJobSpec (``workerPoolSpecs``,
``baseOutputDirectory``, ``scheduling``, ``persistentResourceId``): create submits the
backing CustomJob, the pipeline record and the link the pipelines handler follows on the
job's ``JobFinished`` in one transaction. The pipeline's state is read from the job's and
from the upload step's outcome when asked, so it is never stale.

``trainingTaskInputs`` of the hyperparameter tuning task holds the tuning job's fields
(``studySpec``, ``maxTrialCount``, ``parallelTrialCount``, ``maxFailedTrialCount``,
``trialJobSpec``), checked as ``tuning_jobs`` checks them: create starts the tuning job in
the same transaction (``trainingTaskMetadata.backingHyperparameterTuningJob``), the state
follows the study's, and the pipelines handler uploads the best trial's model when the
study ends SUCCEEDED (``TuningJobEnded``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from services.api import buckets, custom_jobs, ids, tuning_jobs
from services.api import models as model_api
from services.api import operations as ops
from services.api.collection import Collection, Scope, new_id, prior_create, require_cluster
from services.api.context import RESOURCES, ApiContext, load_record, records_of, save_record
from services.api.errors import ApiError, FieldViolation, invalid
from services.api.names import Parent, resource_id
from services.api.wire.custom_job import CustomJob, CustomJobSpec, RpcStatus
from services.api.wire.models import ListTrainingPipelinesResponse, TrainingPipeline
from services.api.wire.proto_json import timestamp
from services.api.wire.tuning import HyperparameterTuningJob
from services.api.wiremodel import parse_message
from services.job_submission import commands as job_commands
from services.pipelines import handlers as pipelines
from services.tuning import handlers as tuning
from shared.domain.errors import ValidationError
from shared.domain.model import Job, JobState

T = TypeVar("T")
KIND = pipelines.PIPELINE_KIND
COLLECTION = "trainingPipelines"
FILTERABLE = ("state", "displayName", "createTime", "trainingTaskDefinition")
SCHEMA = "gs://google-cloud-aiplatform/schema/trainingjob/definition/"
CUSTOM_TASK = f"{SCHEMA}custom_task_1.0.0.yaml"
TUNING_TASK = f"{SCHEMA}hyperparameter_tuning_task_1.0.0.yaml"
_JOB_STATE = {JobState.QUEUED: "PIPELINE_STATE_QUEUED", JobState.PENDING: "PIPELINE_STATE_PENDING",
              JobState.RUNNING: "PIPELINE_STATE_RUNNING",
              JobState.CANCELLING: "PIPELINE_STATE_CANCELLING",
              JobState.CANCELLED: "PIPELINE_STATE_CANCELLED",
              JobState.FAILED: "PIPELINE_STATE_FAILED"}
_INPUT = ("displayName", "trainingTaskDefinition", "trainingTaskInputs", "modelToUpload",
          "modelId", "parentModel", "labels")
_MODEL_INPUT = ("displayName", "description", "versionDescription", "metadataSchemaUri",
                "metadata", "predictSchemata", "containerSpec", "artifactUri", "labels")


def create(ctx: ApiContext, parent: Parent, body: Any, pipeline_id: str | None = None,
           generated: str | None = None) -> dict[str, Any]:
    message = parse_message(TrainingPipeline, body)
    if pipeline_id is not None:
        resource_id(pipeline_id, "trainingPipelineId")
    pipeline_id = pipeline_id or generated
    if not message.display_name:
        raise invalid("displayName", "is required")
    if message.training_task_definition == TUNING_TASK:
        return _create_tuning(ctx, parent, message, pipeline_id)
    if message.training_task_definition != CUSTOM_TASK:
        raise invalid("trainingTaskDefinition", f"must be {CUSTOM_TASK} or {TUNING_TASK}; "
                      f"got {message.training_task_definition!r}")
    if message.training_task_inputs is None:
        raise invalid("trainingTaskInputs", "is required: a CustomJobSpec (workerPoolSpecs, "
                      "persistentResourceId, baseOutputDirectory, ...)")
    spec = _renamed(lambda: parse_message(CustomJobSpec, message.training_task_inputs))
    job_message = CustomJob(display_name=message.display_name, job_spec=spec,
                            labels=message.labels)
    job_body, cluster_id = _renamed(lambda: custom_jobs.domain_body(job_message))
    stored = _stored(message)
    with ctx.unit() as uow:
        pipeline_id = pipeline_id or new_id()
        retried = _retried_create(uow, parent, pipeline_id, stored, ctx.now)
        if retried is not None:
            return retried
        parent_id, model_key = _check_model(uow, parent, message)
        cluster = require_cluster(uow, parent, cluster_id,
                                  "trainingTaskInputs.persistentResourceId")
        _claim(uow, parent, message, spec.to_json(), "trainingTaskInputs", ctx)
        job_id = new_id()
        job = job_commands.submit_job(cluster, job_body, uow, ctx.runtime.deps,
                                      custom_jobs.domain_job_id(job_id))
        save_record(uow, custom_jobs.KIND, job_id, parent,
                    {k: v for k, v in job_message.to_json().items()
                     if k in ("displayName", "jobSpec", "labels")}, ctx.now)
        domain_id = save_record(uow, KIND, pipeline_id, parent, stored, ctx.now)
        record = {**uow.record(RESOURCES, pipelines.pipeline_key(domain_id)),
                  "job_id": job_id, "parent_model_id": parent_id, "model_key": model_key,
                  "upload": None}
        uow.put_record(RESOURCES, pipelines.pipeline_key(domain_id), record)
        uow.put_record(pipelines.PIPELINE_JOBS, job.job_id, {"pipeline": domain_id,
                                                             "time": ctx.now})
        return render(uow, parent, record)


def _retried_create(uow: Any, parent: Parent, pipeline_id: str, stored: dict[str, Any],
                    now: float) -> dict[str, Any] | None:
    """A create retried with the same id and body answers what the first one made (None: no
    such pipeline yet); the same id with another body is ALREADY_EXISTS."""
    existing = prior_create(uow, KIND, pipeline_id, parent,
                            parent.child(COLLECTION, pipeline_id), stored, now)
    return None if existing is None else render(uow, parent, existing)


_TUNING_INPUT = ("studySpec", "maxTrialCount", "parallelTrialCount", "maxFailedTrialCount",
                 "trialJobSpec")


def _create_tuning(ctx: ApiContext, parent: Parent, message: TrainingPipeline,
                   pipeline_id: str | None) -> dict[str, Any]:
    inputs = message.training_task_inputs
    if not isinstance(inputs, dict):
        raise invalid("trainingTaskInputs", "is required: the tuning job's fields (studySpec, "
                      "maxTrialCount, parallelTrialCount, maxFailedTrialCount, trialJobSpec)")
    for key in inputs:
        if key not in _TUNING_INPUT:
            raise invalid(f"trainingTaskInputs.{key}", "is not a field of the hyperparameter "
                          f"tuning task; expected one of {', '.join(_TUNING_INPUT)}")
    body = {**inputs, "displayName": message.display_name, "labels": dict(message.labels)}
    tuning_message = _renamed(lambda: parse_message(HyperparameterTuningJob, body))
    domain = _renamed(lambda: tuning_jobs._domain(tuning_message))
    stored = _stored(message)
    with ctx.unit() as uow:
        pipeline_id = pipeline_id or new_id()
        retried = _retried_create(uow, parent, pipeline_id, stored, ctx.now)
        if retried is not None:
            return retried
        parent_id, model_key = _check_model(uow, parent, message)
        cluster = require_cluster(uow, parent, domain.pop("clusterId"),
                                  "trainingTaskInputs.trialJobSpec.persistentResourceId")
        _claim(uow, parent, message, domain["trialJobWire"], "trainingTaskInputs.trialJobSpec",
               ctx)
        study_id = new_id()
        where = {"parent": parent.name, "project": parent.project, "location": parent.location}
        try:
            tuning.create_study(study_id, where, cluster, domain, uow, ctx.runtime.deps)
        except ValidationError as exc:  # the trial job's spec, as the cluster judges it
            path = exc.path.removeprefix("jobSpec").lstrip(".")
            raise invalid(f"trainingTaskInputs.trialJobSpec{'.' if path else ''}{path}",
                          exc.reason) from None
        save_record(uow, tuning_jobs.KIND, study_id, parent, tuning_jobs._stored(tuning_message),
                    ctx.now)
        domain_id = save_record(uow, KIND, pipeline_id, parent, stored, ctx.now)
        record = {**uow.record(RESOURCES, pipelines.pipeline_key(domain_id)),
                  "study_id": study_id, "parent_model_id": parent_id, "model_key": model_key,
                  "upload": None}
        uow.put_record(RESOURCES, pipelines.pipeline_key(domain_id), record)
        uow.put_record(pipelines.PIPELINE_STUDIES, study_id, {"pipeline": domain_id,
                                                              "time": ctx.now})
        return render(uow, parent, record)


def _cancel(scope: Scope, pipeline_id: str, record: dict[str, Any]) -> None:
    uow, parent, deps = scope.uow, scope.parent, scope.ctx.runtime.deps
    if record.get("study_id"):
        study = tuning.get_study(record["study_id"], uow)
        ended = study is None or study["state"] in tuning.TERMINAL
    else:
        job = uow.jobs.get(custom_jobs.domain_job_id(record["job_id"]))
        ended = job is None or job.terminal
    if ended:
        state = render(uow, parent, record)["state"]
        raise ApiError("FAILED_PRECONDITION", f"training pipeline {pipeline_id} is {state}: "
                       "only a pipeline that has not ended can be cancelled")
    if record.get("study_id"):
        tuning.cancel_study(record["study_id"], uow, deps)
    else:
        job_commands.cancel_job(custom_jobs.domain_job_id(record["job_id"]), uow, deps)


def delete(ctx: ApiContext, parent: Parent, pipeline_id: str) -> dict[str, Any]:
    """A pipeline that has not ended is refused (cancel it first); its backing CustomJob and
    the models it uploaded stay."""
    ctx.refresh()
    with ctx.unit() as uow:
        record = _load(uow, parent, pipeline_id)
        state = render(uow, parent, record)["state"]
        if state not in ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED",
                         "PIPELINE_STATE_CANCELLED"):
            raise ApiError("FAILED_PRECONDITION", f"training pipeline {pipeline_id} is {state}: "
                           "cancel it and wait for PIPELINE_STATE_CANCELLED before deleting it")
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=ids.domain_of(record),
                                               verb="delete",
                                               generation=int(record["created"] * 1e6))
        uow.delete_record(RESOURCES, pipelines.pipeline_key(ids.domain_of(record)))
        if record.get("study_id"):
            uow.delete_record(pipelines.PIPELINE_STUDIES, record["study_id"])
        else:
            uow.delete_record(pipelines.PIPELINE_JOBS, custom_jobs.domain_job_id(record["job_id"]))
        return ops.render(uow, op, ctx.now)


# ---------------------------------------------------------------- conversion


def render(uow: Any, parent: Parent, record: dict[str, Any]) -> dict[str, Any]:
    if record.get("study_id"):
        return _render_tuning(uow, parent, record)
    job = uow.jobs.get(custom_jobs.domain_job_id(record["job_id"]))
    upload = record.get("upload")
    resource = dict(record["resource"])
    state, error = _state(job, upload, bool(resource.get("modelToUpload")))
    out: dict[str, Any] = {
        "name": parent.child(COLLECTION, record["id"]), **resource, "state": state,
        "trainingTaskMetadata": {"backingCustomJob": parent.child("customJobs",
                                                                  record["job_id"])},
        "createTime": timestamp(record["created"]),
        "updateTime": timestamp(max(record["time"], job.updated_at if job else 0,
                                    (upload or {}).get("time", 0))),
    }
    if job is not None and job.started_at is not None:
        out["startTime"] = timestamp(job.started_at)
    if state in ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED",
                 "PIPELINE_STATE_CANCELLED"):
        end = (upload or {}).get("time") or (job.ended_at if job else None) or record["time"]
        out["endTime"] = timestamp(end)
    if error is not None:
        out["error"] = error
    if upload and upload.get("model"):
        out["modelToUpload"] = {**resource["modelToUpload"], "name": upload["model"],
                                "versionId": upload["versionId"]}
    return TrainingPipeline.model_validate(out).to_json()


_STUDY_STATE = {tuning.RUNNING: "PIPELINE_STATE_RUNNING",
                tuning.CANCELLING: "PIPELINE_STATE_CANCELLING",
                tuning.CANCELLED: "PIPELINE_STATE_CANCELLED",
                tuning.FAILED: "PIPELINE_STATE_FAILED"}


def _render_tuning(uow: Any, parent: Parent, record: dict[str, Any]) -> dict[str, Any]:
    study = tuning.get_study(record["study_id"], uow)
    upload = record.get("upload")
    resource = dict(record["resource"])
    error: dict[str, Any] | None = None
    if study is None:
        state, error = "PIPELINE_STATE_FAILED", {"code": 5, "message": "the backing "
                                                 "hyperparameter tuning job was deleted"}
    elif study["state"] == tuning.SUCCEEDED:
        state = "PIPELINE_STATE_SUCCEEDED"
        if resource.get("modelToUpload") and upload is None:
            state = "PIPELINE_STATE_RUNNING"  # the upload step, on TuningJobEnded
        elif upload and upload.get("error"):
            state, error = "PIPELINE_STATE_FAILED", {
                "code": 9, "message": f"the model upload failed: {upload['error']}"}
    else:
        state = _STUDY_STATE[study["state"]]
        if study["state"] == tuning.FAILED:
            error = {"code": 13, "message": study.get("error") or "the tuning job failed"}
        elif study["state"] == tuning.CANCELLED:
            error = {"code": 1, "message": "CANCELED"}
    metadata: dict[str, Any] = {"backingHyperparameterTuningJob": parent.child(
        tuning_jobs.COLLECTION, record["study_id"])}
    out: dict[str, Any] = {
        "name": parent.child(COLLECTION, record["id"]), **resource, "state": state,
        "trainingTaskMetadata": metadata, "createTime": timestamp(record["created"]),
        "updateTime": timestamp(max(record["time"], study["updated_at"] if study else 0,
                                    (upload or {}).get("time", 0))),
    }
    if study is not None and study.get("started_at") is not None:
        out["startTime"] = timestamp(study["started_at"])
    if state in ("PIPELINE_STATE_SUCCEEDED", "PIPELINE_STATE_FAILED",
                 "PIPELINE_STATE_CANCELLED"):
        end = (upload or {}).get("time") or (study or {}).get("ended_at") or record["time"]
        out["endTime"] = timestamp(end)
    if error is not None:
        out["error"] = error
    if upload and upload.get("model"):
        out["modelToUpload"] = {**resource["modelToUpload"], "name": upload["model"],
                                "versionId": upload["versionId"]}
        best = pipelines.best_trial(study) if study else None
        if best is not None:
            metadata["bestTrial"] = best["id"]
            metadata["bestTrialBackingCustomJob"] = parent.child("customJobs",
                                                                 best["api_job_id"])
    return TrainingPipeline.model_validate(out).to_json()


def _state(job: Job | None, upload: dict[str, Any] | None, wants_model: bool
           ) -> tuple[str, dict[str, Any] | None]:
    if job is None:
        return "PIPELINE_STATE_FAILED", {"code": 5, "message": "the backing custom job was "
                                         "deleted"}
    if job.state is JobState.SUCCEEDED:
        if not wants_model:
            return "PIPELINE_STATE_SUCCEEDED", None
        if upload is None:
            return "PIPELINE_STATE_RUNNING", None  # the upload step, on the job's JobFinished
        if upload.get("error"):
            return "PIPELINE_STATE_FAILED", {"code": 9, "message": "the model upload failed: "
                                             f"{upload['error']}"}
        return "PIPELINE_STATE_SUCCEEDED", None
    state = _JOB_STATE[job.state]
    if job.state is JobState.FAILED:
        code = 4 if "timeout" in job.error or "deadline" in job.error else 13
        return state, RpcStatus(code=code, message=job.error or "the job failed").to_json()
    if job.state is JobState.CANCELLED:
        return state, {"code": 1, "message": "CANCELED"}
    return state, None


def _claim(uow: Any, parent: Parent, message: TrainingPipeline, job_spec: dict[str, Any],
           where: str, ctx: ApiContext) -> None:
    """The buckets the training task (its job spec at ``where``) and the model to upload
    name are this project's (``services.api.buckets``)."""
    model = message.model_to_upload
    named = [*buckets.job_uris(job_spec, where), (
        "modelToUpload.artifactUri", (model.artifact_uri if model else None) or "")]
    buckets.claim(uow, parent, named, ctx.now)
    buckets.check_packages(ctx.storage_root, named)


def _check_model(uow: Any, parent: Parent, message: TrainingPipeline
                 ) -> tuple[str | None, str | None]:
    """The registry ids (services.api.ids) of the parentModel, and of the new modelId."""
    if (message.model_id or message.parent_model) and message.model_to_upload is None:
        raise invalid("modelToUpload", "is required with modelId or parentModel")
    if message.model_to_upload is not None and not message.model_to_upload.display_name:
        raise invalid("modelToUpload.displayName", "is required")
    if message.model_id and message.parent_model:
        raise invalid("modelId", "give modelId for a new model or parentModel for a new "
                      "version of one, not both")
    model_key = None
    if message.model_id:
        resource_id(message.model_id, "modelId")
        model_key = ids.domain(uow, parent, message.model_id)
        if model_api.find_head(uow, parent, message.model_id) is not None or \
                uow.record("registry_models", model_key) is not None:
            raise ApiError("ALREADY_EXISTS", f"{parent.child('models', message.model_id)} "
                           "already exists: give parentModel to add a version")
    return (model_api.check_parent_model(uow, parent, message.parent_model, "parentModel"),
            model_key)


def _stored(message: TrainingPipeline) -> dict[str, Any]:
    out = {k: v for k, v in message.to_json().items() if k in _INPUT}
    if "modelToUpload" in out:
        out["modelToUpload"] = {k: v for k, v in out["modelToUpload"].items()
                                if k in _MODEL_INPUT}
    return out


def _renamed(call: Callable[[], T]) -> T:
    """Errors about the backing job's spec, at the pipeline's field (trainingTaskInputs...)."""
    try:
        return call()
    except ApiError as exc:
        def move(path: str) -> str:
            if path == "(body)" or path == "jobSpec":
                return "trainingTaskInputs"
            if path.startswith("jobSpec."):
                return "trainingTaskInputs." + path.removeprefix("jobSpec.")
            if path.startswith("displayName"):
                return path
            return f"trainingTaskInputs.{path}"

        violations = [FieldViolation(move(v.field), v.description) for v in exc.violations]
        message = exc.message
        if exc.violations:
            message = message.replace(exc.violations[0].field, violations[0].field, 1)
        raise ApiError(exc.status, message, violations) from None


def _load(uow: Any, parent: Parent, pipeline_id: str) -> dict[str, Any]:
    return load_record(uow, KIND, pipeline_id, parent, parent.child(COLLECTION, pipeline_id))


PIPELINES: Collection[dict[str, Any]] = Collection(
    ListTrainingPipelinesResponse, "training_pipelines", TrainingPipeline,
    load=lambda scope: records_of(scope.uow, KIND, scope.parent),
    render=lambda scope, record: render(scope.uow, scope.parent, record),
    filterable=FILTERABLE, find=lambda scope, pipeline_id: _load(scope.uow, scope.parent,
                                                                  pipeline_id),
    stop=_cancel, create=create, id_param="trainingPipelineId", remove=delete)
get, list_pipelines, cancel = PIPELINES.get, PIPELINES.list_page, PIPELINES.cancel
