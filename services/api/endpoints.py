"""Endpoints (v1 ``endpoints``): create, get, list, patch, delete, deployModel,
undeployModel, mutateDeployedModel, in Vertex AI's shapes; predict is
``services.api.predict``.

An endpoint is an API record; each of its deployed models holds its replicas, each a
one-rank job on a cluster (``shared.service_layer.serving``) with the port its program
listens on. A deployModel's Operation ends once every replica answers its health route
(``deploy_progress``); the others are done in the call.
"""

from __future__ import annotations

import secrets
import socket
from typing import Any

from pydantic.alias_generators import to_camel

from services.api import ids, models
from services.api import operations as ops
from services.api.collection import Collection, Scope, new_id, prior_create
from services.api.context import (
    RESOURCES,
    ApiContext,
    find_record,
    load_record,
    records_of,
    resource_key,
    save_record,
)
from services.api.errors import ApiError, invalid
from services.api.names import Parent, resource_id
from services.api.serving_router import replica_states
from services.api.wire.endpoints import (
    DeployedModel,
    DeployModelRequest,
    Endpoint,
    ListEndpointsResponse,
    MutateDeployedModelRequest,
    UndeployModelRequest,
)
from services.api.wire.proto_json import timestamp
from services.api.wiremodel import parse_message
from services.job_submission import commands as job_commands
from services.pipelines import registry
from shared.domain.errors import NotFound, ValidationError
from shared.domain.model import ClusterState
from shared.policies.serving import CLUSTER_LABEL, PARTITION_LABEL, PoolOffer, Wanted
from shared.service_layer import serving

KIND = "endpoint"
COLLECTION = "endpoints"
FILTERABLE = ("displayName", "labels", "createTime")
V1 = f"{ops.TYPE}.v1"
_PATCHABLE = ("displayName", "description", "labels", "trafficSplit")
_MUTABLE = ("dedicatedResources.minReplicaCount", "dedicatedResources.maxReplicaCount",
            "dedicatedResources.autoscalingMetricSpecs", "dedicatedResources",
            "disableContainerLogging", "enableAccessLogging")
Shown = dict[str, Any]  # the endpoint's API record


def create(ctx: ApiContext, parent: Parent, body: Any, endpoint_id: str | None = None,
           generated: str | None = None) -> dict[str, Any]:
    message = parse_message(Endpoint, body)
    if not message.display_name:
        raise invalid("displayName", "is required")
    if message.deployed_models or message.traffic_split:
        raise invalid("deployedModels", "deploy models with :deployModel, not in the create")
    if endpoint_id is not None:
        resource_id(endpoint_id, "endpointId")
    stored = {k: v for k, v in message.to_json().items()
              if k in ("displayName", "description", "labels")}
    with ctx.unit() as uow:
        endpoint_id = endpoint_id or generated or new_id()
        name = parent.child(COLLECTION, endpoint_id)
        existing = prior_create(uow, KIND, endpoint_id, parent, name, stored, ctx.now)
        if existing is None:
            save_record(uow, KIND, endpoint_id, parent, stored, ctx.now)
            existing = find_record(uow, KIND, endpoint_id, parent)
        assert existing is not None
        shown = render_record(uow, existing)
        response = {"@type": f"{V1}.Endpoint", **shown}
        op = Scope(ctx, uow, parent).operation(
            target=KIND, target_id=ids.domain_of(existing), verb="create",
            generation=int(existing["created"] * 1e6), response=response)
        return ops.render(uow, op, ctx.now)


def patch(ctx: ApiContext, parent: Parent, endpoint_id: str, body: Any,
          update_mask: str | None) -> dict[str, Any]:
    message = parse_message(Endpoint, body)
    given = message.to_json()
    # the SDK names the mask's fields as the proto does (display_name): either is taken
    paths = [to_camel(p.strip()) for p in (update_mask or "").split(",") if p.strip()] or [
        k for k in _PATCHABLE if k in given]
    for path in paths:
        if path not in _PATCHABLE:
            raise invalid("updateMask", f"{path!r} cannot be updated; these can: "
                          f"{', '.join(_PATCHABLE)}")
    with ctx.unit() as uow:
        record = _load(uow, parent, endpoint_id)
        resource = dict(record["resource"])
        for path in paths:
            if path == "trafficSplit":
                resource["trafficSplit"] = _check_split(dict(message.traffic_split),
                                                        resource, "trafficSplit")
            elif path in given:
                resource[path] = given[path]
            else:
                resource.pop(path, None)
        fresh = save(uow, record, resource, ctx.now)
        return render_record(uow, fresh)


def delete(ctx: ApiContext, parent: Parent, endpoint_id: str) -> dict[str, Any]:
    """Refused while models are deployed on it (undeploy them first), as Vertex does."""
    with ctx.unit() as uow:
        record = _load(uow, parent, endpoint_id)
        if record["resource"].get("deployedModels"):
            raise ApiError("FAILED_PRECONDITION", f"{_name(record)} has deployed models: "
                           "undeploy them before deleting it")
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=ids.domain_of(record),
                                               verb="delete",
                                               generation=int(record["created"] * 1e6))
        uow.delete_record(RESOURCES, resource_key(KIND, ids.domain_of(record)))
        return ops.render(uow, op, ctx.now)


# ---------------------------------------------------------------- deploy, undeploy, mutate


def deploy_model(ctx: ApiContext, parent: Parent, endpoint_id: str, body: Any
                 ) -> dict[str, Any]:
    request = parse_message(DeployModelRequest, body)
    wanted = request.deployed_model
    resources = wanted.dedicated_resources
    if resources is None:
        raise invalid("deployedModel.dedicatedResources", "is required: mtc serves a model "
                      "on dedicated replicas (a machineSpec, minReplicaCount)")
    if not resources.machine_spec.machine_type:
        raise invalid("deployedModel.dedicatedResources.machineSpec.machineType", "is required")
    low = resources.min_replica_count
    high = resources.max_replica_count or low
    if high < low:
        raise invalid("deployedModel.dedicatedResources.maxReplicaCount",
                      f"{high} is below minReplicaCount {low}")
    with ctx.unit() as uow:
        record = _load(uow, parent, endpoint_id)
        resource = dict(record["resource"])
        deployed = list(resource.get("deployedModels") or [])
        dm_id = wanted.id or _new_deployed_id()
        if not dm_id.isdigit():
            resource_id(dm_id, "deployedModel.id")
        if any(d["id"] == dm_id for d in deployed):
            raise ApiError("ALREADY_EXISTS", f"deployed model {dm_id} is on {_name(record)}")
        version = _model_version(uow, parent, wanted)
        container = dict(version["model"].get("containerSpec") or {})
        artifact = version["model"].get("artifactUri")
        storage = serving.storage_path(artifact, ctx.runtime.deps.config.output_root)
        try:
            command = serving.program(container, storage if serving.in_bucket(artifact)
                                      else "")  # (elsewhere: the replica's own copy)
        except ValidationError as exc:
            raise invalid("deployedModel.model", exc.reason) from None
        labels = dict(resource.get("labels") or {})
        cluster_ids = _clusters(uow, parent)
        m = resources.machine_spec
        pool = serving.place(uow, [uow.clusters.get(c) for c in cluster_ids], Wanted(
            m.machine_type, m.accelerator_type, m.accelerator_count or 0,
            _domain_cluster(uow, parent, labels.get(CLUSTER_LABEL)),
            labels.get(PARTITION_LABEL)))
        health, predict = serving.default_routes(record["id"], dm_id)
        entry = {
            "id": dm_id,
            "model": registry.model_name(parent.name, registry.shown(version)),
            "modelVersionId": version["version_id"],
            "displayName": wanted.display_name or version["model"].get("displayName", ""),
            "modelDisplayName": version["model"].get("displayName", ""),
            "created": ctx.now, "cluster": pool.cluster_id, "partition": pool.partition,
            "machine": {"machineType": pool.machine_type,
                        "acceleratorType": pool.accelerator_type,
                        "acceleratorCount": pool.accelerator_count},
            "dedicatedResources": {**resources.to_json(), "maxReplicaCount": high},
            "healthRoute": container.get("healthRoute") or health,
            "predictRoute": container.get("predictRoute") or predict,
            "command": command,
            "env": {e["name"]: e.get("value", "") for e in container.get("env") or []},
            "storage": storage, "artifact": artifact,
            "replicas": [],
        }
        scale(ctx, uow, record, entry, low)
        split = dict(request.traffic_split) or ({} if deployed else {"0": 100})
        split = {(dm_id if k == "0" else k): v for k, v in split.items()}
        deployed.append(entry)
        resource["deployedModels"] = deployed
        resource["trafficSplit"] = _check_split(split, resource, "trafficSplit")
        resource["generation"] = int(resource.get("generation", 0)) + 1
        fresh = save(uow, record, resource, ctx.now)
        response = {"@type": f"{V1}.DeployModelResponse",
                    "deployedModel": render_deployed(uow, entry, extended=False)}
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=ids.domain_of(fresh),
                                               verb="deployModel",
                                               generation=resource["generation"],
                                               response=response)
        return ops.render(uow, op, ctx.now)


def undeploy_model(ctx: ApiContext, parent: Parent, endpoint_id: str, body: Any
                   ) -> dict[str, Any]:
    request = parse_message(UndeployModelRequest, body)
    with ctx.unit() as uow:
        record = _load(uow, parent, endpoint_id)
        resource = dict(record["resource"])
        deployed = list(resource.get("deployedModels") or [])
        entry = next((d for d in deployed if d["id"] == request.deployed_model_id), None)
        if entry is None:
            raise ApiError("NOT_FOUND", f"deployed model {request.deployed_model_id} is not "
                           f"on {_name(record)}")
        scale(ctx, uow, record, entry, 0)
        resource["deployedModels"] = [d for d in deployed if d is not entry]
        split = dict(request.traffic_split) or {
            k: v for k, v in (resource.get("trafficSplit") or {}).items() if k != entry["id"]}
        resource["trafficSplit"] = _check_split(split, resource, "trafficSplit")
        resource["generation"] = int(resource.get("generation", 0)) + 1
        fresh = save(uow, record, resource, ctx.now)
        op = Scope(ctx, uow, parent).operation(
            target=KIND, target_id=ids.domain_of(fresh), verb="undeployModel",
            generation=resource["generation"],
            response={"@type": f"{V1}.UndeployModelResponse"})
        return ops.render(uow, op, ctx.now)


def mutate_deployed_model(ctx: ApiContext, parent: Parent, endpoint_id: str, body: Any
                          ) -> dict[str, Any]:
    """Replica counts and autoscaling specs of a deployed model; replicas are started or
    stopped at once to be within the new bounds."""
    request = parse_message(MutateDeployedModelRequest, body)
    paths = [p.strip() for p in request.update_mask.split(",") if p.strip()]
    for path in paths:
        if path not in _MUTABLE:
            raise invalid("updateMask", f"{path!r} cannot be changed; these can: "
                          f"{', '.join(_MUTABLE)}")
    given = request.deployed_model.dedicated_resources
    with ctx.unit() as uow:
        record = _load(uow, parent, endpoint_id)
        resource = dict(record["resource"])
        deployed = [dict(d) for d in resource.get("deployedModels") or []]
        entry = next((d for d in deployed if d["id"] == request.deployed_model.id), None)
        if entry is None:
            raise ApiError("NOT_FOUND", f"deployed model {request.deployed_model.id} is not "
                           f"on {_name(record)}")
        current = dict(entry["dedicatedResources"])
        if given is not None:
            new = given.to_json()
            for key in ("minReplicaCount", "maxReplicaCount", "autoscalingMetricSpecs"):
                if any(p in (f"dedicatedResources.{key}", "dedicatedResources") for p in paths):
                    current[key] = new.get(key, current.get(key))
        low, high = int(current.get("minReplicaCount", 1)), int(current.get("maxReplicaCount")
                                                                 or 0)
        if high and high < low:
            raise invalid("deployedModel.dedicatedResources.maxReplicaCount",
                          f"{high} is below minReplicaCount {low}")
        high = max(high, low)
        entry["dedicatedResources"] = {**current, "maxReplicaCount": high}
        # within the new bounds; the autoscaler goes on from there
        scale(ctx, uow, record, entry, min(max(len(entry.get("replicas") or []), low), high))
        resource["deployedModels"] = deployed
        resource["generation"] = int(resource.get("generation", 0)) + 1
        fresh = save(uow, record, resource, ctx.now)
        op = Scope(ctx, uow, parent).operation(
            target=KIND, target_id=ids.domain_of(fresh), verb="mutateDeployedModel",
            generation=resource["generation"],
            response={"@type": f"{V1}.MutateDeployedModelResponse",
                      "deployedModel": render_deployed(uow, entry, extended=False)})
        return ops.render(uow, op, ctx.now)


def scale(ctx: ApiContext, uow: Any, record: dict[str, Any], entry: dict[str, Any],
           count: int) -> None:
    """Start replicas up to ``count`` (each a job with a port of its own), or cancel the
    newest ones down to it."""
    replicas = list(entry.get("replicas") or [])
    deps = ctx.runtime.deps
    while len(replicas) > count:
        gone = replicas.pop()
        job = uow.jobs.get(gone["job"])
        if job is not None:
            job_commands.cancel_job(gone["job"], uow, deps)
    index = max((r["index"] for r in replicas), default=-1) + 1
    while len(replicas) < count:
        port = _free_port()
        job_id = f"serve-{secrets.token_hex(6)}-r{index}"
        output, storage = serving.replica_dirs(
            entry.get("artifact"), entry["storage"], ctx.runtime.deps.config.output_root,
            endpoint_id=record["id"], deployed_id=entry["id"], index=index, job_id=job_id)
        env = {**entry["env"], "AIP_HTTP_PORT": str(port),
               "AIP_HEALTH_ROUTE": entry["healthRoute"],
               "AIP_PREDICT_ROUTE": entry["predictRoute"],
               "AIP_STORAGE_URI": storage, "AIP_MODE": "PREDICTION",
               "AIP_ENDPOINT_ID": record["id"], "AIP_DEPLOYED_MODEL_ID": entry["id"],
               "AIP_MACHINE_TYPE": entry["machine"]["machineType"]}
        pool = PoolOffer(entry["cluster"], 0.0, entry["partition"],
                                 entry["machine"]["machineType"],
                                 entry["machine"]["acceleratorType"],
                                 int(entry["machine"]["acceleratorCount"] or 0), 0)
        body = serving.replica_body(
            display_name=f"serve {record['id']}/{entry['id']} replica {index}",
            command=entry["command"], env=env, pool=pool,
            labels={"mtc-endpoint": _label(record["id"]), "mtc-deployed-model": entry["id"]},
            output=output)
        job_commands.submit_job(entry["cluster"], body, uow, deps, job_id)
        replicas.append({"index": index, "job": job_id, "port": port})
        index += 1
    entry["replicas"] = replicas


# ---------------------------------------------------------------- rendering, helpers


def render_record(uow: Any, record: dict[str, Any]) -> dict[str, Any]:
    resource = record["resource"]
    out: dict[str, Any] = {
        "name": _name(record),
        "displayName": resource.get("displayName", ""),
        "deployedModels": [render_deployed(uow, d) for d in resource.get("deployedModels") or []],
        "trafficSplit": dict(resource.get("trafficSplit") or {}),
        "labels": dict(resource.get("labels") or {}),
        "createTime": timestamp(record["created"]), "updateTime": timestamp(record["time"]),
        "etag": str(resource.get("generation", 0)),
    }
    if resource.get("description"):
        out["description"] = resource["description"]
    return Endpoint.model_validate(out).to_json()


def render_deployed(uow: Any, entry: dict[str, Any], *, extended: bool = True
                    ) -> dict[str, Any]:
    """The DeployedModel; ``extended``: with mtc's fields (where its replicas run), which an
    Operation's response leaves out (the SDK unpacks it strictly)."""
    out: dict[str, Any] = {
        "id": entry["id"], "model": entry["model"], "modelVersionId": entry["modelVersionId"],
        "displayName": entry["displayName"], "createTime": timestamp(entry["created"]),
        "dedicatedResources": entry["dedicatedResources"],
    }
    if extended:
        out.update(mtcReplicas=replica_states(uow, entry), mtcCluster=entry["cluster"],
                   mtcScaleEvents=[{**e, "time": timestamp(e["time"])}
                                   for e in entry.get("scaleEvents") or []])
    return DeployedModel.model_validate(out).to_json()


def _name(record: dict[str, Any]) -> str:
    return f"{record['parent']}/{COLLECTION}/{record['id']}"


def _label(value: str) -> str:
    return value.lower()[:63]


def _load(uow: Any, parent: Parent, endpoint_id: str) -> dict[str, Any]:
    return load_record(uow, KIND, endpoint_id, parent, parent.child(COLLECTION, endpoint_id))


def save(uow: Any, record: dict[str, Any], resource: dict[str, Any], now: float
          ) -> dict[str, Any]:
    fresh = {**record, "resource": resource, "time": now}
    uow.put_record(RESOURCES, resource_key(KIND, ids.domain_of(record)), fresh)
    return fresh


def _new_deployed_id() -> str:
    return new_id()[:16].lstrip("0") or "1"


def _free_port() -> int:
    """A port for a replica's program to listen on (every local node shares the host's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check_split(split: dict[str, int], resource: dict[str, Any], field: str
                 ) -> dict[str, int]:
    """A traffic split over the endpoint's deployed models that adds up to 100 (or is empty)."""
    known = {d["id"] for d in resource.get("deployedModels") or []}
    for key, value in split.items():
        if key not in known:
            raise invalid(field, f"{key!r} is not a model deployed on this endpoint")
        if not 0 <= value <= 100:
            raise invalid(field, f"{key}: {value} is not a percentage")
    kept = {k: v for k, v in split.items() if v > 0}
    if kept and sum(kept.values()) != 100:
        raise invalid(field, f"the percentages add up to {sum(kept.values())}, not 100")
    return split


def _model_version(uow: Any, parent: Parent, wanted: DeployedModel) -> dict[str, Any]:
    prefix = f"{parent.name}/models/"
    if not wanted.model.startswith(prefix):
        raise invalid("deployedModel.model", f"must be a model of this project and location, "
                      f"{prefix}MODEL_ID[@VERSION]; got {wanted.model!r}")
    model_id, ref = models.model_ref(wanted.model.removeprefix(prefix))
    ref = ref or wanted.model_version_id or None
    top = models.find_head(uow, parent, model_id)
    if top is None:
        raise invalid("deployedModel.model", f"names no model in {parent.name}")
    try:
        version: dict[str, Any] = registry.version(uow, parent.name, top["id"], ref)
    except NotFound:
        raise invalid("deployedModel.model", f"model {model_id} has no version {ref}") from None
    return version


def _clusters(uow: Any, parent: Parent) -> list[str]:
    """The domain ids of the parent's clusters that take work, oldest first."""
    out = []
    for record in records_of(uow, "cluster", parent):
        cluster = uow.clusters.get(ids.domain_of(record))
        if cluster is not None and cluster.state not in (ClusterState.DELETING,
                                                         ClusterState.DELETED,
                                                         ClusterState.FAILED):
            out.append(cluster.cluster_id)
    return out


def _domain_cluster(uow: Any, parent: Parent, named: str | None) -> str | None:
    if not named:
        return None
    record = find_record(uow, "cluster", named, parent)
    if record is None:
        raise invalid(f"labels.{CLUSTER_LABEL}", f"no cluster {named!r} in {parent.name}")
    return ids.domain_of(record)


def _records(scope: Scope) -> list[Shown]:
    return records_of(scope.uow, KIND, scope.parent)


def _found(scope: Scope, endpoint_id: str) -> Shown:
    return _load(scope.uow, scope.parent, endpoint_id)


ENDPOINTS: Collection[Shown] = Collection(
    ListEndpointsResponse, "endpoints", Endpoint, load=_records,
    render=lambda scope, record: render_record(scope.uow, record), filterable=FILTERABLE,
    find=_found, create=create, id_param="endpointId", remove=delete)
