"""The Model Registry (v1 ``models``): upload, get (``@version`` or ``@alias``), list,
listVersions, mergeVersionAliases, delete, in Vertex AI's shapes.

The records live in ``services.pipelines.registry`` (the pipelines handler uploads through
it too). A version's lineage is mtc's extension ``mtcLineage``: the job, attempt, checkpoint
step and inputs it came from. On upload the producing job is ``mtcLineage.job`` when given,
else the CustomJob of this parent whose ``AIP_MODEL_DIR`` is the ``artifactUri``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from services.api import buckets, ids
from services.api import operations as ops
from services.api.collection import Collection, Scope, new_id
from services.api.context import ApiContext, records_of, resource_key
from services.api.custom_jobs import job_of
from services.api.errors import ApiError, invalid, not_found
from services.api.names import Parent, resource_id
from services.api.wire.models import (
    ListModelsResponse,
    ListModelVersionsResponse,
    MergeVersionAliasesRequest,
    Model,
    UploadModelRequest,
)
from services.api.wire.proto_json import timestamp
from services.api.wiremodel import parse_message
from services.pipelines import registry
from shared.domain.errors import NotFound

COLLECTION = "models"
FILTERABLE = ("displayName", "versionId", "artifactUri")
ALIAS = re.compile(r"^-?[a-z][a-z0-9-]{0,126}[a-z0-9]$|^-?[a-z]$")
RESPONSE = f"{ops.TYPE}.v1.UploadModelResponse"
Shown = tuple[dict[str, Any], dict[str, Any]]  # a version and its model's head record
# what the caller may set; output-only fields in an upload body are ignored, as Vertex does
_INPUT = ("displayName", "description", "versionDescription", "metadataSchemaUri", "metadata",
          "predictSchemata", "containerSpec", "artifactUri", "labels", "versionAliases")


def upload(ctx: ApiContext, parent: Parent, body: Any) -> dict[str, Any]:
    request = parse_message(UploadModelRequest, body)
    if request.parent and request.parent != parent.name:
        raise invalid("parent", f"must be {parent.name} (the path's) or empty")
    model = request.model
    if not model.display_name:
        raise invalid("model.displayName", "is required")
    aliases = _aliases(model.version_aliases, "model.versionAliases")
    if request.model_id and request.parent_model:
        raise invalid("modelId", "give modelId for a new model or parentModel for a new "
                      "version of one, not both")
    parent_id = _parent_model(parent, request.parent_model, "parentModel")
    model_id = request.model_id
    if model_id is not None:
        resource_id(model_id, "modelId")
    wire = {k: v for k, v in model.to_json().items() if k in _INPUT and k != "versionAliases"}
    with ctx.unit() as uow:
        buckets.claim(uow, parent, [("model.artifactUri", model.artifact_uri or "")], ctx.now)
        shown = parent_id or model_id or new_id()  # the API's id; the registry's is per parent
        found = find_head(uow, parent, shown)
        target = found["id"] if found else ids.pinned(uow, parent, ctx.now).domain(parent, shown)
        if model_id is not None and (found or uow.record(registry.MODELS, target)):
            raise ApiError("ALREADY_EXISTS", f"{parent.child(COLLECTION, model_id)} already "
                           "exists: upload a new version with parentModel")
        lineage, job_key = _lineage(ctx, uow, parent, model)
        version = registry.add_version(uow, parent=parent.name, model_id=target,
                                       new_model=parent_id is None, model=wire,
                                       lineage=lineage, job_key=job_key, now=ctx.now,
                                       name_id=shown)
        if aliases:
            registry.merge_aliases(uow, parent.name, target, version["version_id"], aliases,
                                   ctx.now)
        response = {"@type": RESPONSE, "model": parent.child(COLLECTION, shown),
                    "modelVersionId": version["version_id"]}
        op = Scope(ctx, uow, parent).operation(target="model", target_id=target, verb="upload",
                                               generation=int(version["version_id"]),
                                               response=response)
        return ops.render(uow, op, ctx.now)


def merge_version_aliases(ctx: ApiContext, parent: Parent, name: str, body: Any
                          ) -> dict[str, Any]:
    model_id, ref = model_ref(name)
    request = parse_message(MergeVersionAliasesRequest, body)
    changes = _aliases(request.version_aliases, "versionAliases")
    if not changes:
        raise invalid("versionAliases", "is required: aliases to add, or -alias to remove")
    with ctx.unit() as uow:
        record = _version(uow, parent, model_id, ref)
        key = record["model_id"]
        registry.merge_aliases(uow, parent.name, key, record["version_id"], changes, ctx.now)
        fresh = uow.record(registry.VERSIONS, f"{key}@{record['version_id']}")
        return render(fresh, registry.head(uow, parent.name, key))


def delete(ctx: ApiContext, parent: Parent, name: str) -> dict[str, Any]:
    """``models/{id}``: the model and every version; ``models/{id}@{version}``: that version
    (not the default one, nor the only one)."""
    model_id, ref = model_ref(name)
    with ctx.unit() as uow:
        top = _head(uow, parent, model_id)
        key = top["id"]
        if ref is None:
            registry.delete_model(uow, parent.name, key)
            target, generation = key, top["next_version"]
        else:
            record = _version(uow, parent, model_id, ref)
            registry.delete_version(uow, parent.name, key, record["version_id"])
            target, generation = f"{key}@{record['version_id']}", 0
        op = Scope(ctx, uow, parent).operation(target="model", target_id=target,
                                               verb="delete", generation=generation)
        return ops.render(uow, op, ctx.now)


def model_ref(name: str) -> tuple[str, str | None]:
    """``{id}`` or ``{id}@{version or alias}`` (the path's) -> the model id and the ref."""
    model_id, at, ref = name.partition("@")
    return model_id, (ref if at else None)


def _heads(scope: Scope) -> Iterator[Shown]:
    """Each model of the parent once, as its default version, oldest first."""
    uow = scope.uow
    heads = sorted(uow.records(registry.MODELS, {"parent": scope.parent.name}),
                   key=lambda r: (r["created"], r["id"]))
    for top in heads:
        record = uow.record(registry.VERSIONS, f"{top['id']}@{top['aliases'][registry.DEFAULT]}")
        if record is not None:
            yield record, top


def _versions(scope: Scope) -> Iterator[Shown]:
    """The versions of the model ``scope.owner``."""
    top = _head(scope.uow, scope.parent, scope.owner)
    return ((record, top) for record in registry.versions(scope.uow, top["id"]))


def _found(scope: Scope, name: str) -> Shown:
    model_id, ref = model_ref(name)
    record = _version(scope.uow, scope.parent, model_id, ref)
    return record, registry.head(scope.uow, scope.parent.name, record["model_id"])


def list_versions(ctx: ApiContext, parent: Parent, name: str, *,
                  filter_text: str | None = None, size: str | None = None,
                  token: str | None = None) -> dict[str, Any]:
    return VERSIONS.list_page(ctx, parent, filter_text=filter_text, size=size, token=token,
                              owner=model_ref(name)[0])


# ---------------------------------------------------------------- helpers


def render(record: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    version_id = record["version_id"]
    aliases = sorted((a for a, v in top["aliases"].items() if v == version_id),
                     key=lambda a: (a != registry.DEFAULT, a))
    model = dict(record["model"])
    out: dict[str, Any] = {
        "name": registry.model_name(record["parent"], registry.shown(record)),
        "versionId": version_id, "versionAliases": aliases,
        "versionCreateTime": timestamp(record["created"]),
        "versionUpdateTime": timestamp(record["time"]),
        **model,
        "createTime": timestamp(top["created"]), "updateTime": timestamp(record["time"]),
    }
    if record.get("lineage"):
        out["mtcLineage"] = record["lineage"]
    if model.get("containerSpec"):
        out["supportedDeploymentResourcesTypes"] = ["DEDICATED_RESOURCES"]
    return Model.model_validate(out).to_json()


def find_head(uow: Any, parent: Parent, model_id: str) -> dict[str, Any] | None:
    """The registry's head record of ``model_id`` (the API's) under ``parent``, or None; a
    model uploaded before ids were per parent (no ``name_id``) is found at its plain id.
    Another parent's head is not read (``context.find_record``)."""
    key = ids.domain(uow, parent, model_id)
    for k in dict.fromkeys((key, model_id)):
        top = uow.record(registry.MODELS, k, where={"parent": parent.name})
        if top is not None and (k == key or "name_id" not in top):
            return top  # type: ignore[no-any-return]
    return None


def _head(uow: Any, parent: Parent, model_id: str) -> dict[str, Any]:
    """The head record of ``model_id`` (the API's) under ``parent``, or NOT_FOUND."""
    top = find_head(uow, parent, model_id)
    if top is None:
        raise not_found(parent.child(COLLECTION, model_id))
    return top


def _version(uow: Any, parent: Parent, model_id: str, ref: str | None) -> dict[str, Any]:
    key = _head(uow, parent, model_id)["id"]
    try:
        return registry.version(uow, parent.name, key, ref)
    except NotFound:
        raise not_found(f"{parent.child(COLLECTION, model_id)}@{ref}") from None


def _parent_model(parent: Parent, name: str | None, field: str) -> str | None:
    """``projects/p/locations/l/models/ID`` (this parent's) -> ID."""
    if not name:
        return None
    prefix = f"{parent.name}/{COLLECTION}/"
    model_id = name.removeprefix(prefix)
    if not name.startswith(prefix) or not re.fullmatch(r"[A-Za-z0-9_-]{1,128}", model_id):
        raise invalid(field, f"must be a model of this project and location, "
                      f"{prefix}MODEL_ID; got {name!r}")
    return model_id


def check_parent_model(uow: Any, parent: Parent, name: str | None, field: str) -> str | None:
    """A parentModel that names an existing model of ``parent``, as the registry's id (its
    domain id, ``services.api.ids``); else a 400."""
    model_id = _parent_model(parent, name, field)
    if model_id is None:
        return None
    top = find_head(uow, parent, model_id)
    if top is None:
        raise invalid(field, f"names no model in {parent.name} ({model_id!r})")
    return str(top["id"])


def _aliases(values: list[str], field: str) -> list[str]:
    for i, alias in enumerate(values):
        if not ALIAS.fullmatch(alias) or alias.lstrip("-").isdigit():
            raise invalid(f"{field}[{i}]", "an alias is lowercase letters, digits and hyphens, "
                          f"starts with a letter (a leading - removes it); got {alias!r}")
    return list(values)


def _lineage(ctx: ApiContext, uow: Any, parent: Parent, model: Model
             ) -> tuple[dict[str, Any] | None, str | None]:
    """The producing job: ``mtcLineage.job`` when named, else the job of this parent whose
    model directory is ``artifactUri``; None when neither finds one."""
    named = model.mtc_lineage.job if model.mtc_lineage else None
    candidates = records_of(uow, "customJob", parent)
    if named:
        job_id = named.removeprefix(f"{parent.name}/customJobs/")
        if named == job_id:
            raise invalid("model.mtcLineage.job", f"must be {parent.name}/customJobs/JOB_ID")
        candidates = [r for r in candidates if r["id"] == job_id]
        if not candidates:
            raise invalid("model.mtcLineage.job", f"names no custom job in {parent.name}")
    elif model.artifact_uri:
        uri = model.artifact_uri.rstrip("/")
        root = ctx.runtime.deps.config.output_root
        candidates = [r for r in candidates
                      if registry.model_dir(r["resource"], root, job_of(r)) == uri]
    else:
        return None, None
    for record in reversed(candidates):  # the newest job writing there
        job = uow.jobs.get(job_of(record))
        if job is not None:
            name = parent.child("customJobs", record["id"])
            return (registry.lineage(job, name, record["resource"]),
                    resource_key("customJob", ids.domain_of(record)))
    return None, None


MODELS: Collection[Shown] = Collection(
    ListModelsResponse, "models", Model, load=_heads,
    render=lambda _, shown: render(*shown), filterable=FILTERABLE, find=_found,
    remove=delete)
VERSIONS: Collection[Shown] = Collection(
    ListModelVersionsResponse, "models", Model, load=_versions,
    render=lambda _, shown: render(*shown), filterable=FILTERABLE)
get, list_models = MODELS.get, MODELS.list_page
