"""Hyperparameter tuning: a study's trials run as CustomJobs, and the study moves on as they end.

A tuning job is one record (``tuning_studies``) holding its spec and its trials; every
decision is made again from that record and the trials' jobs by ``advance``, which is
idempotent: it reads the trials' metrics, ends the trials whose jobs ended, stops the ones
the early-stopping rule condemns, starts new trials up to ``parallelTrialCount`` (their
parameters from ``shared.policies.tuning.suggest``, deterministic for the same history), and
ends the study when nothing is left to run. It runs on:

- ``JobFinished`` of a trial's job (the trial ends; the next one starts),
- ``JobCheckpointSaved`` of a trial's job (progress: fresh intermediate measurements, early
  stopping),
- ``FleetTicked`` of the cluster (everything again: metrics of trials that do not checkpoint,
  and a catch-up for anything a lost delivery left behind).

Trials are ordinary jobs (``services.job_submission.commands.submit_job``) on the cluster
``trialJobSpec.persistentResourceId`` names, so they heal like any job: a trial whose node
fails is requeued and resumes from its checkpoint, and stays ACTIVE; only a trial whose job
ends FAILED counts toward ``maxFailedTrialCount``. A trial gets ``--<parameterId>=<value>``
appended to every worker pool's args, and ``CLOUD_ML_TRIAL_ID`` and
``CLOUD_ML_HP_METRIC_FILE`` in its environment; the metric file is the trial's own,
``<the job's output directory>/hypertune/output.metrics``, which the ``cloudml-hypertune``
package rewrites (it holds the last 100 reports of the current process: measurements read
earlier are kept in the record, so a resumed trial loses none).

The control plane reads that file directly: on the embedded default compute runs on this
machine, under the configured output root. On Slurm the output root must be on the shared
filesystem the workers write to (the control plane reads what the nodes wrote).

Each trial's CustomJob is also recorded as a CustomJob resource of the tuning job's project
and location (collection ``api_resources``, the API's record shape: see
``services.api.context.save_record``), so ``GET .../customJobs/{id}`` shows it.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
from pathlib import Path
from typing import Any

from mtc_program.protocol import HP_METRIC_FILE, TRIAL_ID
from services.job_submission import commands as job_commands
from shared.domain.errors import Conflict, NotFound
from shared.domain.events import Event, FleetTicked, JobCheckpointSaved, JobFinished, TuningJobEnded
from shared.domain.model import JobState
from shared.handling import Deps, Handler, Outcome
from shared.policies import tuning as policy
from shared.ports import UnitOfWork
from shared.service_layer import gangs

SERVICE = "tuning"
STUDIES = "tuning_studies"
TRIAL_JOBS = "tuning_trial_jobs"  # trial job id -> {study_id}
API_RESOURCES = "api_resources"  # the API's records (services.api.context.RESOURCES)
METRIC_FILE = "hypertune/output.metrics"
MAX_METRIC_BYTES = 1 << 20
RUNNING, SUCCEEDED, FAILED = "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"
CANCELLING, CANCELLED = "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"
TERMINAL = {SUCCEEDED, FAILED, CANCELLED}
LIVE_TRIAL = ("REQUESTED", "ACTIVE", "STOPPING")
log = logging.getLogger("mtc.tuning")


# ---------------------------------------------------------------- commands (from the API)


def create_study(study_id: str, where: dict[str, str], cluster_id: str, body: dict[str, Any],
                 uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    """Record the study and start its first trials. ``where``: {parent, project, location}.
    ``body``: displayName, labels, studySpec, maxTrialCount, parallelTrialCount,
    maxFailedTrialCount, trialJobWire (the jobSpec as the API shows it) and trialJobBody (the
    domain's job body). A retry with the same body answers the same study."""
    existing = uow.record(STUDIES, study_id)  # type: ignore[attr-defined]
    if existing is not None:
        if existing["body"] == body and existing["parent"] == where["parent"]:
            return existing  # type: ignore[no-any-return]
        raise Conflict(f"hyperparameter tuning job {study_id} already exists")
    policy.study_from_json(body["studySpec"])  # refuses what cannot run
    job_commands.get_cluster(cluster_id, uow)
    now = deps.clock.now()
    study: dict[str, Any] = {
        "study_id": study_id, **where, "cluster_id": cluster_id, "body": body,
        "state": RUNNING, "created_at": now, "started_at": now, "updated_at": now,
        "ended_at": None, "error": None, "trials": [], "active": True,
        "seed": int(hashlib.sha256(f"{where['parent']}/{study_id}".encode()).hexdigest(), 16)
        % 2**31,
    }
    advance(study, uow, deps)
    uow.put_record(STUDIES, study_id, study)  # type: ignore[attr-defined]
    return study


def cancel_study(study_id: str, uow: UnitOfWork, deps: Deps) -> dict[str, Any]:
    study = _get(study_id, uow)
    if study["state"] not in TERMINAL and study["state"] != CANCELLING:
        study["state"] = CANCELLING
        for trial in study["trials"]:
            if trial["state"] in LIVE_TRIAL:
                _cancel_trial_job(trial, uow, deps)
        advance(study, uow, deps)
        study["updated_at"] = deps.clock.now()
        uow.put_record(STUDIES, study_id, study)  # type: ignore[attr-defined]
    return study


def delete_study(study_id: str, uow: UnitOfWork) -> list[str]:
    """Forget a finished study and its trials' jobs; returns the trials' CustomJob ids."""
    study = _get(study_id, uow)
    if study["state"] not in TERMINAL or any(t["state"] in LIVE_TRIAL for t in study["trials"]):
        raise Conflict(f"hyperparameter tuning job {study_id} is {study['state']}: cancel it "
                       "and wait for it to end before deleting it")
    ids = []
    for trial in study["trials"]:
        uow.delete_record(TRIAL_JOBS, trial["job_id"])  # type: ignore[attr-defined]
        uow.delete_record("jobs", trial["job_id"])  # type: ignore[attr-defined]
        ids.append(trial["api_job_id"])
    uow.delete_record(STUDIES, study_id)  # type: ignore[attr-defined]
    return ids


def get_study(study_id: str, uow: UnitOfWork) -> dict[str, Any] | None:
    return uow.record(STUDIES, study_id)  # type: ignore[attr-defined,no-any-return]


def _get(study_id: str, uow: UnitOfWork) -> dict[str, Any]:
    study = get_study(study_id, uow)
    if study is None:
        raise NotFound("hyperparameter tuning job", study_id)
    return study


# ---------------------------------------------------------------- events


def on_job_progress(event: JobFinished | JobCheckpointSaved, uow: UnitOfWork, deps: Deps
                    ) -> Outcome | None:
    index = uow.record(TRIAL_JOBS, event.job_id)  # type: ignore[attr-defined]
    if index is None:
        return Outcome.UNCHANGED  # not a trial
    study = get_study(index["study_id"], uow)
    if study is None:
        return Outcome.UNCHANGED
    advance(study, uow, deps)
    return None


def on_fleet_ticked(event: FleetTicked, uow: UnitOfWork, deps: Deps) -> Outcome:
    """A timer: every live study on the cluster is looked at again (idempotent by state)."""
    for study in uow.records(STUDIES, {"cluster_id": event.cluster_id,  # type: ignore[attr-defined]
                                       "active": True}):
        advance(dict(study), uow, deps)
    return Outcome.UNCHANGED


# ---------------------------------------------------------------- the study's step


def advance(study: dict[str, Any], uow: UnitOfWork, deps: Deps) -> None:
    """Everything that is due for ``study``, decided from its record and its trials' jobs."""
    body = study["body"]
    spec = policy.study_from_json(body["studySpec"])
    now = deps.clock.now()
    before = copy.deepcopy(study)
    for trial in study["trials"]:
        if trial["state"] in LIVE_TRIAL:
            _refresh(trial, spec, uow, deps, now, study)
    if study["state"] == RUNNING:
        failed = sum(1 for t in study["trials"] if t.get("counts_as_failed"))
        limit = int(body.get("maxFailedTrialCount") or 0)
        if limit and failed > limit:
            study["state"], study["error"] = FAILED, (
                f"{failed} trials failed, more than maxFailedTrialCount={limit}")
            for trial in study["trials"]:
                if trial["state"] in LIVE_TRIAL:
                    _cancel_trial_job(trial, uow, deps)
        else:
            _early_stop(study, spec, uow, deps)
            _start_trials(study, spec, uow, deps, now)
    for trial in study["trials"]:  # what the cancels above ended at once
        if trial["state"] in LIVE_TRIAL:
            _refresh(trial, spec, uow, deps, now, study)
    live = any(t["state"] in LIVE_TRIAL for t in study["trials"])
    if not live and study["state"] == CANCELLING:
        study["state"], study["error"] = CANCELLED, "CANCELED"
    elif not live and study["state"] == RUNNING:
        if any(t["state"] == "SUCCEEDED" for t in study["trials"]):
            study["state"] = SUCCEEDED
        else:
            study["state"], study["error"] = FAILED, "no trial succeeded"
    if study["state"] in TERMINAL and study["ended_at"] is None:
        study["ended_at"] = now  # once: what reacts to the end (pipelines) hears it once
        uow.emit(TuningJobEnded(study["study_id"], study["cluster_id"], study["state"]))
    study["active"] = study["state"] not in TERMINAL or live
    if study != before:
        study["updated_at"] = now
        uow.put_record(STUDIES, study["study_id"], study)  # type: ignore[attr-defined]


def _views(study: dict[str, Any]) -> list[policy.TrialView]:
    return [policy.TrialView(t["parameters"], t["state"], _measurements(t),
                             t["final"][1] if t.get("final") else None, t["id"])
            for t in study["trials"]]


def _measurements(trial: dict[str, Any]) -> tuple[policy.Measurement, ...]:
    return tuple(policy.Measurement(int(s), float(v), float(e)) for s, v, e in trial["measurements"])


def _early_stop(study: dict[str, Any], spec: policy.Study, uow: UnitOfWork, deps: Deps) -> None:
    if not spec.stopping:
        return
    views = _views(study)
    for trial, view in zip(study["trials"], views, strict=True):
        if trial["state"] != "ACTIVE":
            continue
        reason = policy.should_stop(spec, view, [v for v in views if v is not view])
        if reason:
            trial["state"], trial["stop_reason"] = "STOPPING", reason
            _cancel_trial_job(trial, uow, deps)


def _start_trials(study: dict[str, Any], spec: policy.Study, uow: UnitOfWork, deps: Deps,
                  now: float) -> None:
    body = study["body"]
    budget = policy.trial_budget(spec, int(body.get("maxTrialCount") or 1))
    parallel = max(1, int(body.get("parallelTrialCount") or 1))
    while len(study["trials"]) < budget and sum(
            1 for t in study["trials"] if t["state"] in LIVE_TRIAL) < parallel:
        index = len(study["trials"])
        params = policy.suggest(spec, _views(study), index, study["seed"])
        trial = _submit_trial(study, str(index + 1), params, uow, deps, now)
        study["trials"].append(trial)


def _submit_trial(study: dict[str, Any], trial_id: str, params: dict[str, policy.Value],
                  uow: UnitOfWork, deps: Deps, now: float) -> dict[str, Any]:
    body = study["body"]
    key = "/".join((study["parent"], study["study_id"], trial_id))
    api_id = f"{int(hashlib.sha256(key.encode()).hexdigest(), 16) % 10**18:018d}"
    job_id = f"cj-{api_id}"  # the API's domain id for a numeric CustomJob id
    wire = copy.deepcopy(body["trialJobWire"])
    domain = copy.deepcopy(body["trialJobBody"])
    uri = (domain["jobSpec"].get("baseOutputDirectory") or {}).get("outputUriPrefix")
    if uri:
        trial_uri = {"outputUriPrefix": f"{uri.rstrip('/')}/{trial_id}"}
        domain["jobSpec"]["baseOutputDirectory"] = wire["baseOutputDirectory"] = trial_uri
        uri = trial_uri["outputUriPrefix"]
    metric_file = f"{gangs.local_output_dir(uri, deps.config.output_root, job_id)}/{METRIC_FILE}"
    args = [f"--{k}={_arg(v)}" for k, v in params.items()]
    env = [{"name": TRIAL_ID, "value": trial_id}, {"name": HP_METRIC_FILE, "value": metric_file}]
    for spec in (wire, domain["jobSpec"]):
        for pool in spec.get("workerPoolSpecs", []):
            program = pool.get("containerSpec") or pool.get("pythonPackageSpec")
            if program is None:
                continue
            program["args"] = [*program.get("args", []), *args]
            program["env"] = [e for e in program.get("env", [])
                              if e["name"] not in (TRIAL_ID, HP_METRIC_FILE)
                              ] + env
    name = f"{body.get('displayName') or study['study_id']}-trial-{trial_id}"[:128]
    domain["displayName"] = name
    job_commands.submit_job(study["cluster_id"], domain, uow, deps, job_id)
    uow.put_record(TRIAL_JOBS, job_id, {"study_id": study["study_id"]})  # type: ignore[attr-defined]
    uow.put_record(API_RESOURCES, f"customJob:{api_id}", {  # type: ignore[attr-defined]
        "kind": "customJob", "id": api_id, "parent": study["parent"],
        "project": study["project"], "location": study["location"],
        "resource": {"displayName": name, "jobSpec": wire, "labels": dict(body.get("labels", {}))},
        "created": now, "time": now})
    return {"id": trial_id, "state": "ACTIVE", "parameters": params, "job_id": job_id,
            "api_job_id": api_id, "metric_file": metric_file,
            "metric_id": body["studySpec"]["metrics"][0]["metricId"], "measurements": [],
            "final": None, "start": now, "end": None, "reason": "", "stop_reason": "",
            "counts_as_failed": False}


def _arg(value: policy.Value) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _cancel_trial_job(trial: dict[str, Any], uow: UnitOfWork, deps: Deps) -> None:
    with contextlib.suppress(NotFound):
        job_commands.cancel_job(trial["job_id"], uow, deps)


def _refresh(trial: dict[str, Any], spec: policy.Study, uow: UnitOfWork, deps: Deps,
             now: float, study: dict[str, Any]) -> None:
    """Read the trial's metrics; end it if its job has ended."""
    new = policy.parse_metric_lines(read_metric_file(trial["metric_file"]), spec.metric_id,
                                    trial["start"])
    merged = policy.merge(_measurements(trial), new)
    trial["measurements"] = [[m.step, m.value, m.elapsed_s] for m in merged]
    job = uow.jobs.get(trial["job_id"])
    if job is not None and not job.terminal:
        return
    trial["end"] = now
    final = policy.final_measurement(spec, merged)
    if trial["state"] == "STOPPING" and merged:
        trial["state"], trial["final"] = "SUCCEEDED", [merged[-1].step, merged[-1].value,
                                                       merged[-1].elapsed_s]
        return
    state = job.state if job is not None else None
    if state is JobState.SUCCEEDED and final is not None:
        trial["state"], trial["final"] = "SUCCEEDED", [final.step, final.value, final.elapsed_s]
        return
    trial["state"] = "INFEASIBLE"
    if state is JobState.SUCCEEDED:
        trial["reason"] = f"the trial reported no value of metric {spec.metric_id!r}"
        trial["counts_as_failed"] = True
    elif state is JobState.FAILED:
        trial["reason"] = f"its custom job failed: {job.error if job else ''}".rstrip(": ")
        trial["counts_as_failed"] = True
    elif study["state"] in (CANCELLING, CANCELLED, FAILED):
        trial["reason"] = "the tuning job ended before the trial"
    else:
        trial["reason"] = "its custom job was cancelled" if job else "its custom job is gone"


def read_metric_file(path: str) -> str:
    """The trial's metric file as written so far ("" when there is none yet)."""
    try:
        with Path(path).open("rb") as f:
            return f.read(MAX_METRIC_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""


SUBSCRIPTIONS: dict[type[Event], Handler] = {
    JobFinished: on_job_progress,
    JobCheckpointSaved: on_job_progress,
    FleetTicked: on_fleet_ticked,
}
