"""The OpenAPI 3.1 document of the API, generated from the wire models and ``routes.ROUTES``.

Every route of the dispatcher is a path here (both ``v1`` and ``v1beta1`` where the route
takes either), with its path and query parameters, the wire model its body is parsed into
(validation schema) and the one its answer is printed from (serialization schema), and the
``google.rpc.Status`` body of every error. OpenAPI 3.1 because its schemas are JSON Schema
2020-12, which is what pydantic writes (``anyOf`` with ``null``, ``$defs``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic.json_schema import JsonSchemaMode, models_json_schema

from services.api.errors import CANONICAL
from services.api.names import REQUEST_ID, RESOURCE_ID, SEGMENT
from services.api.wire.cluster import (
    ClusterNode,
    ListClusterNodesResponse,
    ListModelDevelopmentClustersResponse,
    ModelDevelopmentCluster,
    NodeOperatorRequest,
    ReportFaultyNodesRequest,
    RolloutSoftwareRequest,
)
from services.api.wire.custom_job import CustomJob, ListCustomJobsResponse
from services.api.wire.endpoints import (
    DeployModelRequest,
    Endpoint,
    ListEndpointsResponse,
    MutateDeployedModelRequest,
    PredictRequest,
    PredictResponse,
    UndeployModelRequest,
)
from services.api.wire.health_report import ReportNodeHealthRequest, ReportNodeHealthResponse
from services.api.wire.job_logs import ReadCustomJobLogsResponse
from services.api.wire.models import (
    ListModelsResponse,
    ListModelVersionsResponse,
    ListTrainingPipelinesResponse,
    MergeVersionAliasesRequest,
    Model,
    TrainingPipeline,
    UploadModelRequest,
)
from services.api.wire.operation import ListOperationsResponse, Operation, WaitOperationRequest
from services.api.wire.proto_json import Message
from services.api.wire.slurm_rest import CallSlurmRestApiRequest, CallSlurmRestApiResponse
from services.api.wire.triage_policy import (
    ClearTriagePolicyRequest,
    ConfigureTriagePolicyRequest,
    DecideRecommendationRequest,
    TriagePolicy,
)
from services.api.wire.tuning import HyperparameterTuningJob, ListHyperparameterTuningJobsResponse

REF = "#/components/schemas/{model}"
ERROR_STATUSES = (400, 401, 403, 404, 409, 413, 429)
_GROUP = re.compile(r"\(\?P<(?P<name>\w+)>(?P<body>[^()]*)\)")
_COLLECTION_ID = re.compile(r"/(?P<collection>[A-Za-z]+)s/\{rid\}")
Refs = dict[tuple[Any, JsonSchemaMode], dict[str, Any]]  # (model, mode) -> {"$ref": ...}
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


class RouteLike(Protocol):
    """What the document needs of a ``routes.Route`` (passed in: any table can be documented)."""

    @property
    def method(self) -> str: ...
    @property
    def pattern(self) -> re.Pattern[str]: ...
    @property
    def permission(self) -> str: ...


@dataclass(frozen=True)
class Spec:
    """What the route table does not say: the verb's name, body, answer, query."""

    verb: str
    response: type[Message] | str  # a wire model, or a component name (Empty)
    body: type[Message] | str | None = None
    body_required: bool = True
    query: tuple[str, ...] = ()
    summary: str = ""


PAGING = ("pageSize", "pageToken")
SPECS: dict[tuple[str, str], Spec] = {
    ("POST", "customJobs"): Spec("create", CustomJob, CustomJob, query=("customJobId", "requestId"),
                                 summary="Create a CustomJob on a cluster"),
    ("GET", "customJobs"): Spec("list", ListCustomJobsResponse, query=(*PAGING, "filter"),
                                summary="List CustomJobs"),
    ("GET", "customJobs/{customJob}"): Spec("get", CustomJob, summary="Get a CustomJob"),
    ("DELETE", "customJobs/{customJob}"): Spec("delete", Operation,
                                               summary="Delete a finished CustomJob"),
    ("POST", "customJobs/{customJob}:cancel"): Spec(
        "cancel", "Empty", "CancelRequest", body_required=False, summary="Cancel a CustomJob"),
    ("POST", "modelDevelopmentClusters"): Spec(
        "create", Operation, ModelDevelopmentCluster, query=("modelDevelopmentClusterId", "requestId"),
        summary="Create a cluster (a long-running Operation)"),
    ("GET", "modelDevelopmentClusters"): Spec(
        "list", ListModelDevelopmentClustersResponse, query=(*PAGING, "filter"),
        summary="List clusters"),
    ("GET", "modelDevelopmentClusters/{modelDevelopmentCluster}"): Spec(
        "get", ModelDevelopmentCluster, summary="Get a cluster"),
    ("PATCH", "modelDevelopmentClusters/{modelDevelopmentCluster}"): Spec(
        "update", Operation, ModelDevelopmentCluster,
        summary="Update a cluster: the full resource (a long-running Operation)"),
    ("DELETE", "modelDevelopmentClusters/{modelDevelopmentCluster}"): Spec(
        "delete", Operation, summary="Delete a cluster (a long-running Operation)"),
    ("GET", "modelDevelopmentClusters/{modelDevelopmentCluster}/nodes"): Spec(
        "nodes", ListClusterNodesResponse, query=PAGING,
        summary="mtc extension: the cluster's nodes, as sinfo shows them"),
    ("POST", "modelDevelopmentClusters/{modelDevelopmentCluster}/nodes/{node}:reportHealth"): Spec(
        "reportHealth", ReportNodeHealthResponse, ReportNodeHealthRequest,
        summary="mtc extension: a node health report (faults), as its agent would send it"),
    ("POST", "modelDevelopmentClusters/{modelDevelopmentCluster}:reportFaultyNodes"): Spec(
        "reportFaultyNodes", Operation, ReportFaultyNodesRequest,
        summary="Delete faulty nodes (recreated, same name) or report their hosts (mtc: "
                "several nodes a call)"),
    ("POST", "modelDevelopmentClusters/{modelDevelopmentCluster}:rolloutSoftware"): Spec(
        "rolloutSoftware", Operation, RolloutSoftwareRequest,
        summary="mtc extension: roll a software version out in waves, rolled back on a "
                "regression"),
    ("POST", "modelDevelopmentClusters/{modelDevelopmentCluster}:callSlurmRestApi"): Spec(
        "callSlurmRestApi", CallSlurmRestApiResponse, CallSlurmRestApiRequest,
        summary="The Slurm Job API: one call to the cluster's slurmrestd (/slurm/v0.0.38/...)"),
    ("GET", "operations"): Spec("list", ListOperationsResponse, query=(*PAGING, "filter"),
                                summary="List Operations"),
    ("GET", "operations/{operation}"): Spec("get", Operation, summary="Get an Operation"),
    ("DELETE", "operations/{operation}"): Spec("delete", "Empty",
                                               summary="Delete an Operation's record"),
    ("POST", "operations/{operation}:wait"): Spec(
        "wait", Operation, WaitOperationRequest, body_required=False,
        summary="Wait until an Operation is done or the timeout passes"),
    ("POST", "operations/{operation}:cancel"): Spec(
        "cancel", "Empty", "CancelRequest", body_required=False,
        summary="Cancel an Operation (a cluster create not yet done)"),
}
NODE_OPS = {  # mtc extension: an operator's commands on a node (body {"reason": ...})
    "releaseHold": "the repair the blast-radius guard held back runs now",
    "drain": "drain the node (its job checkpoints and moves); it stays out until resumed",
    "resume": "return a node an operator drained (verified first if it had faults)",
    "returnToService": "verify a FAILED node and return it to service (or FAILED again)",
}
SPECS.update({
    ("POST", f"modelDevelopmentClusters/{{modelDevelopmentCluster}}/nodes/{{node}}:{verb}"):
    Spec(verb, ClusterNode, NodeOperatorRequest, summary=f"mtc extension: {what}")
    for verb, what in NODE_OPS.items()})
TRIAGE = "modelDevelopmentClusters/{modelDevelopmentCluster}/triagePolicy"
# mtc extension: a candidate triage table's rollout (each body with a "reason")
TRIAGE_OPS: dict[str, tuple[type[Message], str]] = {
    "configure": (ConfigureTriagePolicyRequest, "set the candidate triage table and its "
                  "stages (shadow, recommend, active) by cause and partition"),
    "accept": (DecideRecommendationRequest, "accept a recommendation: the candidate's "
               "decision goes through the repair service (the guard included)"),
    "dismiss": (DecideRecommendationRequest, "dismiss a recommendation, saying why"),
    "clear": (ClearTriagePolicyRequest, "remove the candidate, its report and its "
              "recommendations"),
}
SPECS[("GET", TRIAGE)] = Spec("triagePolicy", TriagePolicy, summary="mtc extension: the "
                              "candidate triage table's rollout, diff report by cause and "
                              "recommendations")
SPECS.update({("POST", f"{TRIAGE}:{verb}"): Spec(verb, TriagePolicy, body,
                                                 summary=f"mtc extension: {what}")
              for verb, (body, what) in TRIAGE_OPS.items()})
HPT = "hyperparameterTuningJobs"
SPECS.update({
    ("POST", HPT): Spec("create", HyperparameterTuningJob, HyperparameterTuningJob,
                        query=("hyperparameterTuningJobId", "requestId"),
                        summary="Create a HyperparameterTuningJob: its trials run on a cluster"),
    ("GET", HPT): Spec("list", ListHyperparameterTuningJobsResponse, query=(*PAGING, "filter"),
                       summary="List HyperparameterTuningJobs"),
    ("GET", f"{HPT}/{{hyperparameterTuningJob}}"): Spec(
        "get", HyperparameterTuningJob, summary="Get a HyperparameterTuningJob"),
    ("DELETE", f"{HPT}/{{hyperparameterTuningJob}}"): Spec(
        "delete", Operation, summary="Delete a finished HyperparameterTuningJob"),
    ("POST", f"{HPT}/{{hyperparameterTuningJob}}:cancel"): Spec(
        "cancel", "Empty", "CancelRequest", body_required=False,
        summary="Cancel a HyperparameterTuningJob (and its running trials)"),
})
TPL = "trainingPipelines"
SPECS.update({  # the Model Registry and training pipelines
    ("POST", "models:upload"): Spec("upload", Operation, UploadModelRequest,
                                    summary="Upload a model, or a new version of one"),
    ("GET", "models"): Spec("list", ListModelsResponse, query=(*PAGING, "filter"),
                            summary="List models (each as its default version)"),
    ("GET", "models/{model}"): Spec("get", Model, summary="Get a model: ID, ID@VERSION or "
                                    "ID@ALIAS"),
    ("DELETE", "models/{model}"): Spec("delete", Operation, summary="Delete a model (ID) or "
                                       "one version (ID@VERSION)"),
    ("GET", "models/{model}:listVersions"): Spec("listVersions", ListModelVersionsResponse,
                                                 query=(*PAGING, "filter"),
                                                 summary="List a model's versions"),
    ("POST", "models/{model}:mergeVersionAliases"): Spec(
        "mergeVersionAliases", Model, MergeVersionAliasesRequest,
        summary="Add (alias) or remove (-alias) a version's aliases"),
    ("POST", TPL): Spec("create", TrainingPipeline, TrainingPipeline,
                        query=("trainingPipelineId", "requestId"),
                        summary="Create a TrainingPipeline (custom task; model upload)"),
    ("GET", TPL): Spec("list", ListTrainingPipelinesResponse, query=(*PAGING, "filter"),
                       summary="List TrainingPipelines"),
    ("GET", f"{TPL}/{{trainingPipeline}}"): Spec("get", TrainingPipeline,
                                                 summary="Get a TrainingPipeline"),
    ("DELETE", f"{TPL}/{{trainingPipeline}}"): Spec("delete", Operation,
                                                    summary="Delete an ended TrainingPipeline"),
    ("POST", f"{TPL}/{{trainingPipeline}}:cancel"): Spec(
        "cancel", "Empty", "CancelRequest", body_required=False,
        summary="Cancel a TrainingPipeline (its backing job)"),
})

_ID_SCHEMA = {"type": "string", "pattern": RESOURCE_ID.pattern}
QUERY: dict[str, dict[str, Any]] = {
    "customJobId": {"description": "the new job's id; generated (a number) when absent",
                    "schema": _ID_SCHEMA},
    "hyperparameterTuningJobId": {"description": "the new tuning job's id; generated (a "
                                  "number) when absent", "schema": _ID_SCHEMA},
    "trainingPipelineId": {"description": "the new pipeline's id; generated (a number) when "
                           "absent", "schema": _ID_SCHEMA},
    "modelDevelopmentClusterId": {"description": "the new cluster's id", "required": True,
                                  "schema": _ID_SCHEMA},
    "requestId": {"description": "a UUID the client chooses (AIP-155): a retried create with "
                  "the same one answers what the first made (200) instead of making a "
                  "second; with another body it is ALREADY_EXISTS (409)",
                  "schema": {"type": "string", "format": "uuid", "pattern": REQUEST_ID.pattern}},
    "pageSize": {"description": "at most this many items (0: the default, 100; "
                 "at most 1000)", "schema": {"type": "integer", "format": "int32",
                                             "minimum": 0, "maximum": 2**31 - 1}},
    "pageToken": {"description": "nextPageToken of the previous page, with the same filter",
                  "schema": {"type": "string"}},
    "filter": {"description": 'AIP-160 subset: field="value" terms (=, !=, :) joined by AND',
               "schema": {"type": "string"}},
}
SPECS[("GET", "customJobs/{customJob}/logs")] = Spec(  # mtc extension: worker output
    "readLogs", ReadCustomJobLogsResponse, query=("attempt", "rank", *PAGING),
    summary="mtc extension: one rank's output of one attempt, paged by byte offset; "
    "nextPageToken is empty once the attempt ended and all of it was read")
QUERY.update({
    "attempt": {"description": "readLogs: the attempt (1, 2, ...; default the newest)",
                "schema": {"type": "integer", "format": "int32", "minimum": 1,
                           "maximum": 2**31 - 1}},
    "endpointId": {"description": "the new endpoint's id; generated (a number) when absent",
                   "schema": _ID_SCHEMA},
    "updateMask": {"description": "the fields to change, comma-separated (all given: absent)",
                   "schema": {"type": "string"}},
    "rank": {"description": "readLogs: the rank (default 0)",
             "schema": {"type": "integer", "format": "int32", "minimum": 0,
                        "maximum": 2**31 - 1}},
})
STATUS_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "description": "google.rpc.Status, as Google's REST APIs write an error",
    "properties": {"error": {
        "type": "object", "required": ["code", "message", "status"],
        "additionalProperties": False,
        "properties": {"code": {"type": "integer", "description": "the HTTP status"},
                       "message": {"type": "string"},
                       "status": {"type": "string", "enum": list(CANONICAL)},
                       "details": {"type": "array", "items": {
                           "type": "object", "required": ["@type"],
                           "properties": {"@type": {"type": "string"}}}}}}},
}
EXTRA_SCHEMAS: dict[str, dict[str, Any]] = {
    "Status": STATUS_SCHEMA,
    "Empty": {"type": "object", "additionalProperties": False,
              "description": "google.protobuf.Empty: {}"},
    "CancelRequest": {"type": "object", "description": "{} (the name is in the path)"},
    "HttpBody": {"type": "object", "description": "rawPredict: the model's own JSON, as is"},
}
EP = "endpoints/{endpoint}"
SPECS.update({  # endpoints: deployed models served by replicas on a cluster
    ("POST", "endpoints"): Spec("create", Operation, Endpoint, query=("endpointId", "requestId"),
                                summary="Create an Endpoint (a long-running Operation)"),
    ("GET", "endpoints"): Spec("list", ListEndpointsResponse, query=(*PAGING, "filter"),
                               summary="List Endpoints"),
    ("GET", EP): Spec("get", Endpoint, summary="Get an Endpoint, its deployed models and "
                      "where their replicas run (mtcReplicas)"),
    ("PATCH", EP): Spec("patch", Endpoint, Endpoint, query=("updateMask",),
                        summary="Update displayName, description, labels, trafficSplit"),
    ("DELETE", EP): Spec("delete", Operation, summary="Delete an Endpoint with no deployed "
                         "model"),
    ("POST", f"{EP}:deployModel"): Spec(
        "deployModel", Operation, DeployModelRequest,
        summary="Deploy a model version: replicas on a cluster's nodes; finished once they answer"),
    ("POST", f"{EP}:undeployModel"): Spec("undeployModel", Operation, UndeployModelRequest,
                                          summary="Undeploy a model: its replicas stop"),
    ("POST", f"{EP}:mutateDeployedModel"): Spec(
        "mutateDeployedModel", Operation, MutateDeployedModelRequest,
        summary="Change a deployed model's replica counts (updateMask)"),
    ("POST", f"{EP}:predict"): Spec("predict", PredictResponse, PredictRequest,
                                    summary="Predictions from a ready replica (503 with "
                                    "Retry-After while none is)"),
    ("POST", f"{EP}:rawPredict"): Spec("rawPredict", "HttpBody", "HttpBody",
                                       summary="The body to a ready replica, its answer back "
                                       "as is"),
})


def templates(pattern: str) -> list[tuple[str, str]]:
    """A route's regex as OpenAPI paths, one per API version: ``[(version, path)]``."""
    versions: list[str] = [""]
    out = pattern
    for group in _GROUP.finditer(pattern):
        name, body = group["name"], group["body"]
        if name == "version":
            versions = body.split("|")
            out = out.replace(group[0], "{version}")
        elif name == "rid":
            out = out.replace(group[0], "{rid}")
        else:
            out = out.replace(group[0], "{" + name + "}")
    out = _COLLECTION_ID.sub(lambda m: f"/{m['collection']}s/{{{m['collection']}}}", out)
    if not re.fullmatch(r"[A-Za-z0-9/{}:]+", out) or "{rid}" in out:
        raise ValueError(f"route {pattern!r} has a part OpenAPI cannot express: {out!r}")
    return [(v, out.replace("{version}", v)) for v in versions]


def _fix_bounds(node: Any) -> Any:
    """pydantic writes a constraint on an ``Annotated`` type with its own JSON schema as a
    bare ``ge``/``le``, which JSON Schema ignores; make it ``minimum``/``maximum`` where the
    value is a number (the integer branch of int64's string-or-integer), drop it elsewhere
    (a Duration's bounds are in seconds: its description says so)."""
    if isinstance(node, list):
        return [_fix_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _fix_bounds(v) for k, v in node.items() if k not in _BOUNDS}
    bounds = {_BOUNDS[k]: v for k, v in node.items() if k in _BOUNDS}
    if not bounds:
        return out
    if out.get("type") in ("integer", "number"):
        out.update(bounds)
    elif "oneOf" in out:
        out["oneOf"] = [{**b, **bounds} if b.get("type") in ("integer", "number") else b
                        for b in out["oneOf"]]
    else:
        words = ", ".join(f"{k} {v}" for k, v in bounds.items())
        out["description"] = f"{out.get('description', '')} ({words} seconds)".strip()
    return out


def _schemas() -> tuple[Refs, dict[str, Any]]:
    wanted: list[tuple[type[Message], JsonSchemaMode]] = []
    for spec in SPECS.values():
        if isinstance(spec.body, type):
            wanted.append((spec.body, "validation"))
        if isinstance(spec.response, type):
            wanted.append((spec.response, "serialization"))
    refs, defs = models_json_schema(list(dict.fromkeys(wanted)), by_alias=True,
                                    ref_template=REF)
    components = {name: _fix_bounds(schema) for name, schema in defs.get("$defs", {}).items()}
    return refs, {**components, **EXTRA_SCHEMAS}


def _ref(model: type[Message] | str, mode: JsonSchemaMode,
         refs: Refs) -> dict[str, Any]:
    if isinstance(model, str):
        return {"$ref": REF.format(model=model)}
    return dict(refs[(model, mode)])


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": REF.format(model="Status")}}}}


ERRORS = {400: "INVALID_ARGUMENT or FAILED_PRECONDITION: a field violation names the field",
          401: "UNAUTHENTICATED: no or an invalid bearer token",
          403: "PERMISSION_DENIED: the token lacks the permission on this project",
          404: "NOT_FOUND", 409: "ALREADY_EXISTS or ABORTED",
          413: "the request body is larger than 1 MiB",
          429: "RESOURCE_EXHAUSTED"}


def _operation(version: str, tail: str, route_permission: str, spec: Spec,
               refs: Refs) -> dict[str, Any]:
    collection = tail.split("/", 1)[0]
    op: dict[str, Any] = {
        "operationId": f"{version}.{collection}.{spec.verb}",
        "summary": spec.summary, "tags": [collection],
        "x-mtc-permission": route_permission,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {
                "schema": _ref(spec.response, "serialization", refs)}}},
            **{str(code): _error(ERRORS[code]) for code in ERROR_STATUSES},
            "default": _error("any other error, as a google.rpc.Status"),
        },
    }
    if spec.query:
        op["parameters"] = [{"name": q, "in": "query", "required": False, **QUERY[q]}
                            for q in spec.query]
    if spec.body is not None:
        op["requestBody"] = {"required": spec.body_required, "content": {
            "application/json": {"schema": _ref(spec.body, "validation", refs)}}}
    return op


def _path_parameters(path: str) -> list[dict[str, Any]]:
    out = []
    for name in re.findall(r"\{(\w+)\}", path):
        schema = ({"type": "string", "pattern": SEGMENT.pattern}
                  if name in ("project", "location") else
                  {"type": "string", "pattern": r"^[^/:]+$"})
        out.append({"name": name, "in": "path", "required": True, "schema": schema})
    return out


def document(routes: Iterable[RouteLike]) -> dict[str, Any]:
    """The document of ``routes`` (``routes.ROUTES``); a route ``SPECS`` lacks is a KeyError."""
    refs, components = _schemas()
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        for version, path in templates(route.pattern.pattern):
            tail = path.split("/locations/{location}/", 1)[1]
            spec = SPECS[(route.method, tail)]
            item = paths.setdefault(path, {"parameters": _path_parameters(path)})
            item[route.method.lower()] = _operation(version, tail, route.permission, spec, refs)
    return {
        "openapi": "3.1.0",
        "info": {"title": "mtc: managed training control plane (Vertex AI REST surface)",
                 "version": "0.1.0",
                 "description": "customJobs, modelDevelopmentClusters and operations in "
                                "Vertex AI's proto3 JSON shapes"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": dict(sorted(components.items())),
                       "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearerAuth": []}],
    }
