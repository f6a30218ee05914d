"""The Model Registry's records: models, their versions, aliases and lineage.

Both the API (``models:upload``) and the pipelines handler (the upload when a training
pipeline's job succeeds) write versions through here, in the caller's unit of work, so a
version, its model's head record and the producing job's list of models commit together.

Records (plain records beside the entities, ``uow.record/put_record``), keyed by the model's
domain id (``model_id`` here: the API's ``modelId`` in its parent's namespace, mapped by
``services.api.ids``; ``name_id``, the id the API shows, is kept beside it):

- ``registry_models/{model_id}``: the head: parent, name_id, created, the next version
  number, and the aliases (alias -> version id; ``default`` always names one version);
- ``registry_model_versions/{model_id}@{versionId}``: the version's Model fields (the wire
  form, camelCase), its lineage (``mtcLineage``), created, updated;
- the producing CustomJob's API record (``api_resources/customJob:{id}``) gets the version's
  name appended to ``models``, which the job renders as ``mtcModels``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from shared.domain.errors import Conflict, NotFound, ValidationError
from shared.domain.model import Job

MODELS = "registry_models"
VERSIONS = "registry_model_versions"
JOB_RECORDS = "api_resources"  # the API's resource records: customJob:{id} holds `models`
DEFAULT = "default"


def new_model_id(*seed: object) -> str:
    """A numeric id, as Vertex's are; derived from ``seed`` so a redelivered upload makes the
    same model, not a second one."""
    return str(int(hashlib.sha256("|".join(map(str, seed)).encode()).hexdigest()[:15], 16))


def model_name(parent: str, model_id: str) -> str:
    return f"{parent}/models/{model_id}"


def shown(record: dict[str, Any]) -> str:
    """The id the API shows for a head or version record (older records: their key's)."""
    return str(record.get("name_id") or record.get("model_id") or record["id"])


def head(uow: Any, parent: str, model_id: str) -> dict[str, Any]:
    record = uow.record(MODELS, model_id)
    if record is None or record["parent"] != parent:
        raise NotFound("model", model_name(parent, model_id))
    return record  # type: ignore[no-any-return]


def versions(uow: Any, model_id: str) -> list[dict[str, Any]]:
    return sorted(uow.records(VERSIONS, {"model_id": model_id}),
                  key=lambda r: int(r["version_id"]))


def version(uow: Any, parent: str, model_id: str, ref: str | None) -> dict[str, Any]:
    """A version by id (``@2``), by alias (``@default``, ``@champion``) or the default."""
    top = head(uow, parent, model_id)
    wanted = top["aliases"].get(ref or DEFAULT, ref)
    record = uow.record(VERSIONS, f"{model_id}@{wanted}")
    if record is None:
        raise NotFound("model version", f"{model_name(parent, shown(top))}@{ref}")
    return record  # type: ignore[no-any-return]


def add_version(uow: Any, *, parent: str, model_id: str, new_model: bool, model: dict[str, Any],
                lineage: dict[str, Any] | None, job_key: str | None, now: float,
                name_id: str | None = None) -> dict[str, Any]:
    """Upload ``model`` (wire fields) as the next version of ``model_id`` (a new model when
    ``new_model``; ``name_id``: its API id, default ``model_id``); the new version takes the
    ``default`` alias."""
    existing = uow.record(MODELS, model_id)
    name_id = name_id or (shown(existing) if existing else model_id)
    if new_model and existing is not None:
        raise Conflict(f"{model_name(parent, name_id)} already exists: upload a new version "
                       "with parentModel")
    if not new_model and (existing is None or existing["parent"] != parent):
        raise ValidationError("parentModel", f"names no model in {parent} ({name_id!r})")
    top = existing or {"id": model_id, "name_id": name_id, "parent": parent, "created": now,
                       "next_version": 1, "aliases": {}}
    version_id = str(top["next_version"])
    top = {**top, "next_version": top["next_version"] + 1, "time": now,
           "aliases": {**top["aliases"], DEFAULT: version_id}}
    record = {"model_id": model_id, "name_id": name_id, "parent": parent,
              "version_id": version_id,
              "model": model, "lineage": lineage, "job_key": job_key, "created": now,
              "time": now}
    uow.put_record(MODELS, model_id, top)
    uow.put_record(VERSIONS, f"{model_id}@{version_id}", record)
    if job_key is not None:
        _link(uow, job_key, f"{model_name(parent, name_id)}@{version_id}", add=True)
    return record


def merge_aliases(uow: Any, parent: str, model_id: str, version_id: str, changes: list[str],
                  now: float) -> None:
    """``alias`` moves the alias to this version; ``-alias`` takes it off. ``default`` can be
    moved, never removed."""
    top = head(uow, parent, model_id)
    aliases = dict(top["aliases"])
    for i, change in enumerate(changes):
        name = change.removeprefix("-")
        if change.startswith("-"):
            if name == DEFAULT:
                raise ValidationError(f"versionAliases[{i}]", "the default alias cannot be "
                                      "removed: move it to another version instead")
            if aliases.get(name) == version_id:
                aliases.pop(name)
        else:
            aliases[name] = version_id
    uow.put_record(MODELS, model_id, {**top, "aliases": aliases, "time": now})
    record = uow.record(VERSIONS, f"{model_id}@{version_id}")
    if record is not None:
        uow.put_record(VERSIONS, f"{model_id}@{version_id}", {**record, "time": now})


def delete_version(uow: Any, parent: str, model_id: str, version_id: str) -> None:
    top = head(uow, parent, model_id)
    all_versions = versions(uow, model_id)
    if len(all_versions) <= 1:
        raise Conflict(f"version {version_id} is the only version of "
                       f"{model_name(parent, shown(top))}: delete the model instead")
    if top["aliases"].get(DEFAULT) == version_id:
        raise Conflict(f"version {version_id} holds the default alias: move it to another "
                       "version (mergeVersionAliases) before deleting this one")
    record = uow.record(VERSIONS, f"{model_id}@{version_id}")
    if record is None:
        raise NotFound("model version", f"{model_name(parent, shown(top))}@{version_id}")
    _drop(uow, parent, record)
    aliases = {a: v for a, v in top["aliases"].items() if v != version_id}
    uow.put_record(MODELS, model_id, {**top, "aliases": aliases})


def delete_model(uow: Any, parent: str, model_id: str) -> None:
    head(uow, parent, model_id)
    for record in versions(uow, model_id):
        _drop(uow, parent, record)
    uow.delete_record(MODELS, model_id)


def _drop(uow: Any, parent: str, record: dict[str, Any]) -> None:
    model_id, version_id = record["model_id"], record["version_id"]
    uow.delete_record(VERSIONS, f"{model_id}@{version_id}")
    if record.get("job_key"):
        _link(uow, record["job_key"], f"{model_name(parent, shown(record))}@{version_id}",
              add=False)


def _link(uow: Any, job_key: str, name: str, *, add: bool) -> None:
    job_record = uow.record(JOB_RECORDS, job_key)
    if job_record is None:
        return  # the job was deleted; the version keeps its lineage
    models = [m for m in job_record.get("models", []) if m != name]
    uow.put_record(JOB_RECORDS, job_key, {**job_record,
                                          "models": [*models, name] if add else models})


# ---------------------------------------------------------------- lineage


def model_dir(job_resource: dict[str, Any], output_root: Path, domain_job_id: str) -> str:
    """The job's ``AIP_MODEL_DIR`` as its caller names it: ``gs://...`` under
    baseOutputDirectory, or the local directory the embedded default gives it."""
    prefix = ((job_resource.get("jobSpec") or {}).get("baseOutputDirectory") or {}).get(
        "outputUriPrefix")
    if prefix:
        return f"{prefix.rstrip('/')}/model"
    return str(output_root / domain_job_id / "model")


def lineage(job: Job, job_name: str, job_resource: dict[str, Any],
            training_pipeline: str | None = None) -> dict[str, Any]:
    """The version's ``mtcLineage``: the job, its attempt and latest checkpoint now, and what
    its chief replica ran."""
    spec = job_resource.get("jobSpec") or {}
    pools = spec.get("workerPoolSpecs") or [{}]
    code = pools[0].get("containerSpec") or pools[0].get("pythonPackageSpec") or {}
    inputs: dict[str, Any] = {"command": list(code.get("command", [])),
                              "args": list(code.get("args", [])),
                              "env": list(code.get("env", []))}
    prefix = (spec.get("baseOutputDirectory") or {}).get("outputUriPrefix")
    if prefix:
        inputs["baseOutputDirectory"] = prefix
    out: dict[str, Any] = {"job": job_name, "attempt": job.attempt, "inputs": inputs}
    latest = job.latest_checkpoint
    if latest is not None:
        out["checkpointStep"] = latest.step
        out["checkpointPath"] = latest.path
    if training_pipeline:
        out["trainingPipeline"] = training_pipeline
    return out
