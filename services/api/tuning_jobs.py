"""HyperparameterTuningJobs: create, get, list, cancel, delete, in Vertex AI's v1 shapes.

The study itself is run by the tuning service (``services.tuning.handlers``): its trials are
CustomJobs on the cluster ``trialJobSpec.persistentResourceId`` names. This module checks and
converts the wire message (the trial job spec through ``custom_jobs.domain_body``, the study
spec through ``shared.policies.tuning.study_from_json``) and renders the stored study.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from services.api import buckets, custom_jobs, ids
from services.api import operations as ops
from services.api.collection import Collection, Scope, new_id, prior_create, require_cluster
from services.api.context import (
    RESOURCES,
    ApiContext,
    create_id,
    load_record,
    records_of,
    resource_key,
    save_record,
)
from services.api.errors import ApiError, invalid, not_found
from services.api.names import Parent, resource_id
from services.api.wire.custom_job import CustomJob
from services.api.wire.proto_json import format_duration, timestamp
from services.api.wire.tuning import HyperparameterTuningJob, ListHyperparameterTuningJobsResponse
from services.api.wiremodel import parse_message
from services.tuning import handlers as h
from shared.policies import tuning as policy

KIND = "hyperparameterTuningJob"
COLLECTION = "hyperparameterTuningJobs"
FILTERABLE = ("state", "displayName", "createTime")
Shown = tuple[dict[str, Any], dict[str, Any]]  # a study and its API record
_INPUT = ("displayName", "studySpec", "maxTrialCount", "parallelTrialCount",
          "maxFailedTrialCount", "trialJobSpec", "labels")


def create(ctx: ApiContext, parent: Parent, body: Any, study_id: str | None = None,
           generated: str | None = None) -> dict[str, Any]:
    message = parse_message(HyperparameterTuningJob, body)
    domain = _domain(message)
    if study_id is not None:
        resource_id(study_id, "hyperparameterTuningJobId")
    with ctx.unit() as uow:
        cluster = require_cluster(uow, parent, domain.pop("clusterId"),
                                  "trialJobSpec.persistentResourceId")
        named = buckets.job_uris(domain["trialJobWire"], "trialJobSpec")
        buckets.claim(uow, parent, named, ctx.now)
        buckets.check_packages(ctx.storage_root, named)
        study_id = study_id or generated or new_id()
        existing = prior_create(uow, KIND, study_id, parent,
                                parent.child(COLLECTION, study_id), _stored(message), ctx.now)
        where = {"parent": parent.name, "project": parent.project, "location": parent.location}
        study = h.create_study(create_id(uow, KIND, study_id, parent, ctx.now), where,
                               cluster, domain, uow, ctx.runtime.deps)
        if existing is None:
            save_record(uow, KIND, study_id, parent, _stored(message), ctx.now)
        return render(study, parent, study_id, {"resource": _stored(message)})


def delete(ctx: ApiContext, parent: Parent, study_id: str) -> dict[str, Any]:
    """A tuning job that still runs is refused (cancel it first); deleting one deletes its
    trials' CustomJobs too."""
    ctx.refresh()
    with ctx.unit() as uow:
        record = load_record(uow, KIND, study_id, parent, parent.child(COLLECTION, study_id))
        domain_id = ids.domain_of(record)
        study = h.get_study(domain_id, uow)
        if study is not None and study["state"] not in h.TERMINAL:
            raise ApiError("FAILED_PRECONDITION", f"hyperparameter tuning job {study_id} is "
                           f"{study['state']}: cancel it and wait for JOB_STATE_CANCELLED "
                           "before deleting it")
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=domain_id, verb="delete",
                                               generation=int(record["created"] * 1e6))
        if study is not None:
            for job_id in h.delete_study(domain_id, uow):
                uow.delete_record(RESOURCES, f"customJob:{job_id}")  # numbers: their own
        uow.delete_record(RESOURCES, resource_key(KIND, domain_id))
        return ops.render(uow, op, ctx.now)


# ---------------------------------------------------------------- conversion


def _domain(message: HyperparameterTuningJob) -> dict[str, Any]:
    """What the tuning service runs; refuses what cannot run, naming the field."""
    if not message.display_name:
        raise invalid("displayName", "is required")
    if message.study_spec is None:
        raise invalid("studySpec", "is required")
    if message.trial_job_spec is None:
        raise invalid("trialJobSpec", "is required")
    if message.max_trial_count < 1:
        raise invalid("maxTrialCount", "must be at least 1")
    if message.parallel_trial_count < 1:
        raise invalid("parallelTrialCount", "must be at least 1")
    if message.parallel_trial_count > message.max_trial_count:
        raise invalid("parallelTrialCount", "must not be larger than maxTrialCount")
    if message.trials or message.state or message.error:
        field = "trials" if message.trials else "state" if message.state else "error"
        raise invalid(field, "is output only")
    study_json = message.study_spec.to_json()
    try:
        policy.study_from_json(study_json)
    except policy.SpecError as exc:
        raise invalid(f"studySpec.{exc.field}", exc.reason) from None
    job = CustomJob(display_name=message.display_name, job_spec=message.trial_job_spec,
                    labels=message.labels)
    try:
        body, cluster_id = custom_jobs.domain_body(job)
    except ApiError as exc:
        raise _renamed(exc) from None
    return {"clusterId": cluster_id, "displayName": message.display_name,
            "labels": dict(message.labels), "studySpec": study_json,
            "maxTrialCount": message.max_trial_count,
            "parallelTrialCount": message.parallel_trial_count,
            "maxFailedTrialCount": message.max_failed_trial_count,
            "trialJobWire": message.trial_job_spec.to_json(), "trialJobBody": body}


def _renamed(exc: ApiError) -> ApiError:
    """custom_jobs names ``jobSpec.*``; here the same fields are ``trialJobSpec.*``."""
    def fix(text: str) -> str:
        return text.replace("jobSpec", "trialJobSpec", 1) if text.startswith("jobSpec") else text

    violations = [type(v)(fix(v.field), v.description) for v in exc.violations]
    return ApiError(exc.status, fix(exc.message), violations, exc.reason, exc.http)


def _stored(message: HyperparameterTuningJob) -> dict[str, Any]:
    return {k: v for k, v in message.to_json().items() if k in _INPUT}


def render(study: dict[str, Any], parent: Parent, study_id: str, record: dict[str, Any]
           ) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": parent.child(COLLECTION, study_id), **record["resource"],
        "state": study["state"],
        "createTime": timestamp(study["created_at"]),
        "updateTime": timestamp(study["updated_at"]),
        "trials": [_trial(t, parent) for t in study["trials"]],
    }
    if study.get("started_at") is not None:
        out["startTime"] = timestamp(study["started_at"])
    if study.get("ended_at") is not None:
        out["endTime"] = timestamp(study["ended_at"])
    if study["state"] == h.FAILED:
        out["error"] = {"code": 13, "message": study.get("error") or "the tuning job failed"}
    elif study["state"] == h.CANCELLED:
        out["error"] = {"code": 1, "message": "CANCELED"}
    return HyperparameterTuningJob.model_validate(out).to_json()


def _measurement(step: int, value: float, elapsed: float, metric_id: str) -> dict[str, Any]:
    return {"stepCount": str(step), "elapsedDuration": format_duration(round(elapsed, 6)),
            "metrics": [{"metricId": metric_id, "value": value}]}


def _trial(t: dict[str, Any], parent: Parent) -> dict[str, Any]:
    metric_id = t.get("metric_id") or ""
    out: dict[str, Any] = {
        "id": t["id"], "state": t["state"],
        "parameters": [{"parameterId": k, "value": v} for k, v in t["parameters"].items()],
        "measurements": [_measurement(s, v, e, metric_id) for s, v, e in t["measurements"]],
        "startTime": timestamp(t["start"]),
        "customJob": parent.child("customJobs", t["api_job_id"]),
    }
    if t.get("final"):
        step, value, elapsed = t["final"]
        out["finalMeasurement"] = _measurement(step, value, elapsed, metric_id)
    if t.get("end") is not None:
        out["endTime"] = timestamp(t["end"])
    if t["state"] == "INFEASIBLE" and t.get("reason"):
        out["infeasibleReason"] = t["reason"]
    return out


def _listed(scope: Scope) -> Iterator[Shown]:
    for record in records_of(scope.uow, KIND, scope.parent):
        study = h.get_study(ids.domain_of(record), scope.uow)
        if study is not None:
            yield study, record


def _found(scope: Scope, study_id: str) -> Shown:
    name = scope.parent.child(COLLECTION, study_id)
    record = load_record(scope.uow, KIND, study_id, scope.parent, name)
    study = h.get_study(ids.domain_of(record), scope.uow)
    if study is None:
        raise not_found(name)
    return study, record


def _cancel(scope: Scope, study_id: str, shown: Shown) -> None:
    """Refused once the tuning job has ended, naming its state."""
    study, record = shown
    if study["state"] in h.TERMINAL:
        state = render(study, scope.parent, record["id"], record)["state"]
        raise ApiError("FAILED_PRECONDITION", f"hyperparameter tuning job {study_id} is "
                       f"{state}: only a job that has not ended can be cancelled")
    h.cancel_study(ids.domain_of(record), scope.uow, scope.ctx.runtime.deps)


STUDIES: Collection[Shown] = Collection(
    ListHyperparameterTuningJobsResponse, "hyperparameter_tuning_jobs",
    HyperparameterTuningJob, load=_listed,
    render=lambda scope, shown: render(shown[0], scope.parent, shown[1]["id"], shown[1]),
    filterable=FILTERABLE, find=_found, stop=_cancel, create=create,
    id_param="hyperparameterTuningJobId", remove=delete)
get, list_jobs, cancel = STUDIES.get, STUDIES.list_page, STUDIES.cancel
