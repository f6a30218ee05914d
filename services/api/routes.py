"""Every route of the API, as one table: method, path pattern, permission, handler.

A handler takes the ``Call`` (``services.api.call``) and returns the answer's body (200); an
error is an ``ApiError`` it raises. The standard methods of a collection are its
``Collection``'s handlers (``services.api.collection``); custom methods are the small
functions below. Adding a resource is a ``Collection`` (a load, a find and a render
function) and its rows here; ``services.api.openapi`` documents every row.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.api import (
    clusters,
    custom_jobs,
    endpoints,
    faulty_nodes,
    models,
    node_health,
    node_ops,
    operations_api,
    rollouts,
    serving_router,
    slurm_rest,
    training_pipelines,
    triage_policy,
    tuning_jobs,
)
from services.api import job_logs as logs_api
from services.api.auth import NODE_REPORT, REPORT_FAULTY
from services.api.call import Call

Handler = Callable[[Call], Any]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    permission: str
    handler: Handler
    reasoned: bool = False  # the body's "reason" goes in the audit record

    @property
    def mutates(self) -> bool:
        """Audited: a change (a wait or a prediction changes nothing)."""
        return self.method != "GET" and not self.permission.endswith((".wait", ".predict"))


def _row(method: str, path: str, permission: str, handler: Handler,
         reasoned: bool = False) -> Route:
    return Route(method, re.compile(path), permission, handler, reasoned)


# ---------------------------------------------------------------- custom methods


def _job_logs(c: Call) -> Any:
    return logs_api.read(c.ctx, c.parent, c.rid, rank=c.arg("rank"), attempt=c.arg("attempt"),
                         size=c.arg("pageSize"), token=c.arg("pageToken"))


def _cluster_update(c: Call) -> Any:
    return clusters.update(c.ctx, c.parent, c.rid, c.body(), force=c.flag("force"))


def _cluster_delete(c: Call) -> Any:
    return clusters.delete(c.ctx, c.parent, c.rid, force=c.flag("force"))


def _cluster_nodes(c: Call) -> Any:
    return clusters.nodes(c.ctx, c.parent, c.rid, size=c.arg("pageSize"),
                          token=c.arg("pageToken"))


def _report_health(c: Call) -> Any:
    return node_health.report_health(c.ctx, c.parent, c.rid, c.path["node"], c.body())


def _node_command(verb: str) -> Handler:
    def act(c: Call) -> Any:
        return node_ops.act(c.ctx, c.parent, c.rid, c.path["node"], verb, c.body(),
                            c.principal)
    return act


def _report_faulty(c: Call) -> Any:
    return faulty_nodes.report(c.ctx, c.parent, c.rid, c.body(), c.principal)


def _triage_policy(c: Call) -> Any:
    return triage_policy.get(c.ctx, c.parent, c.rid)


def _triage_command(verb: str) -> Handler:
    def act(c: Call) -> Any:
        return triage_policy.act(c.ctx, c.parent, c.rid, verb, c.body(), c.principal)
    return act


def _rollout(c: Call) -> Any:
    return rollouts.start(c.ctx, c.parent, c.rid, c.body(), c.principal)


def _slurm_rest(c: Call) -> Any:
    return slurm_rest.call(c.ctx, c.parent, c.rid, c.body())


def _op_wait(c: Call) -> Any:
    return operations_api.wait(c.ctx, c.parent, c.rid, c.body(required=False))


def _model_upload(c: Call) -> Any:
    return models.upload(c.ctx, c.parent, c.body())


def _model_versions(c: Call) -> Any:
    return models.VERSIONS.serve_list(c, owner=models.model_ref(c.rid)[0])


def _model_aliases(c: Call) -> Any:
    return models.merge_version_aliases(c.ctx, c.parent, c.rid, c.body())


def _endpoint_patch(c: Call) -> Any:
    return endpoints.patch(c.ctx, c.parent, c.rid, c.body(), c.arg("updateMask"))


def _endpoint_verb(handler: Callable[..., Any]) -> Handler:
    def act(c: Call) -> Any:
        return handler(c.ctx, c.parent, c.rid, c.body())
    return act


def _predict(c: Call) -> Any:
    return serving_router.predict(c.ctx, c.parent, c.rid, c.body())


def _raw_predict(c: Call) -> Any:
    return serving_router.predict(c.ctx, c.parent, c.rid, c.body(), raw=True)


# ---------------------------------------------------------------- the table

_P = r"projects/(?P<project>[^/:]+)/locations/(?P<location>[^/:]+)"
_V = r"(?P<version>v1|v1beta1)"
_ID = r"/(?P<rid>[^/:]+)"
_NODE = r"/nodes/(?P<node>[^/:]+)"
JOBS, J = f"/{_V}/{_P}/customJobs", "aiplatform.customJobs"
HPT, HT = f"/{_V}/{_P}/hyperparameterTuningJobs", "aiplatform.hyperparameterTuningJobs"
CLUSTERS = f"/(?P<version>v1beta1)/{_P}/modelDevelopmentClusters"
C = "aiplatform.modelDevelopmentClusters"
OPS, OP = f"/{_V}/{_P}/operations", "aiplatform.operations"
# the SDK's REST operations client polls an Operation at its first http rule, /ui/{name}
UI_OPS = f"/(?P<version>ui)/{_P}/operations"
MODELS, MO = f"/{_V}/{_P}/models", "aiplatform.models"
PIPELINES, TP = f"/{_V}/{_P}/trainingPipelines", "aiplatform.trainingPipelines"
ENDPOINTS, EP = f"/{_V}/{_P}/endpoints", "aiplatform.endpoints"
CJ, ST, CL = custom_jobs.JOBS, tuning_jobs.STUDIES, clusters.CLUSTERS
OPC, MC, PC = operations_api.OPERATIONS, models.MODELS, training_pipelines.PIPELINES
EC = endpoints.ENDPOINTS

ROUTES: tuple[Route, ...] = (
    _row("POST", JOBS, f"{J}.create", CJ.serve_create),
    _row("GET", JOBS, f"{J}.list", CJ.serve_list),
    _row("GET", f"{JOBS}{_ID}", f"{J}.get", CJ.serve_get),
    _row("DELETE", f"{JOBS}{_ID}", f"{J}.delete", CJ.serve_delete),
    _row("POST", f"{JOBS}{_ID}:cancel", f"{J}.cancel", CJ.serve_cancel, reasoned=True),
    _row("GET", f"{JOBS}{_ID}/logs", f"{J}.get", _job_logs),
    _row("POST", HPT, f"{HT}.create", ST.serve_create),
    _row("GET", HPT, f"{HT}.list", ST.serve_list),
    _row("GET", f"{HPT}{_ID}", f"{HT}.get", ST.serve_get),
    _row("DELETE", f"{HPT}{_ID}", f"{HT}.delete", ST.serve_delete),
    _row("POST", f"{HPT}{_ID}:cancel", f"{HT}.cancel", ST.serve_cancel, reasoned=True),
    _row("POST", CLUSTERS, f"{C}.create", CL.serve_create),
    _row("GET", CLUSTERS, f"{C}.list", CL.serve_list),
    _row("GET", f"{CLUSTERS}{_ID}", f"{C}.get", CL.serve_get),
    _row("PATCH", f"{CLUSTERS}{_ID}", f"{C}.update", _cluster_update),
    _row("DELETE", f"{CLUSTERS}{_ID}", f"{C}.delete", _cluster_delete),
    _row("GET", f"{CLUSTERS}{_ID}/nodes", f"{C}.get", _cluster_nodes),
    _row("POST", f"{CLUSTERS}{_ID}{_NODE}:reportHealth", NODE_REPORT, _report_health),
    *(_row("POST", f"{CLUSTERS}{_ID}{_NODE}:{verb}", f"{C}.update", _node_command(verb),
           reasoned=True) for verb in node_ops.VERBS),
    _row("POST", f"{CLUSTERS}{_ID}:reportFaultyNodes", REPORT_FAULTY, _report_faulty),
    _row("GET", f"{CLUSTERS}{_ID}/triagePolicy", f"{C}.get", _triage_policy),
    *(_row("POST", f"{CLUSTERS}{_ID}/triagePolicy:{verb}", f"{C}.update",
           _triage_command(verb), reasoned=True) for verb in triage_policy.VERBS),
    _row("POST", f"{CLUSTERS}{_ID}:{rollouts.VERB}", f"{C}.update", _rollout),
    _row("POST", f"{CLUSTERS}{_ID}:callSlurmRestApi", f"{C}.run", _slurm_rest),
    _row("GET", OPS, f"{OP}.list", OPC.serve_list),
    _row("GET", f"{OPS}{_ID}", f"{OP}.get", OPC.serve_get),
    _row("GET", f"{UI_OPS}{_ID}", f"{OP}.get", OPC.serve_get),
    _row("DELETE", f"{OPS}{_ID}", f"{OP}.delete", OPC.serve_delete),
    _row("POST", f"{OPS}{_ID}:wait", f"{OP}.wait", _op_wait),
    _row("POST", f"{OPS}{_ID}:cancel", f"{OP}.cancel", OPC.serve_cancel),
    _row("POST", f"{MODELS}:upload", f"{MO}.create", _model_upload),
    _row("GET", MODELS, f"{MO}.list", MC.serve_list),
    _row("GET", f"{MODELS}{_ID}", f"{MO}.get", MC.serve_get),
    _row("DELETE", f"{MODELS}{_ID}", f"{MO}.delete", MC.serve_delete),
    _row("GET", f"{MODELS}{_ID}:listVersions", f"{MO}.list", _model_versions),
    _row("POST", f"{MODELS}{_ID}:mergeVersionAliases", f"{MO}.update", _model_aliases),
    _row("POST", PIPELINES, f"{TP}.create", PC.serve_create),
    _row("GET", PIPELINES, f"{TP}.list", PC.serve_list),
    _row("GET", f"{PIPELINES}{_ID}", f"{TP}.get", PC.serve_get),
    _row("DELETE", f"{PIPELINES}{_ID}", f"{TP}.delete", PC.serve_delete),
    _row("POST", f"{PIPELINES}{_ID}:cancel", f"{TP}.cancel", PC.serve_cancel),
    _row("POST", ENDPOINTS, f"{EP}.create", EC.serve_create),
    _row("GET", ENDPOINTS, f"{EP}.list", EC.serve_list),
    _row("GET", f"{ENDPOINTS}{_ID}", f"{EP}.get", EC.serve_get),
    _row("PATCH", f"{ENDPOINTS}{_ID}", f"{EP}.update", _endpoint_patch),
    _row("DELETE", f"{ENDPOINTS}{_ID}", f"{EP}.delete", EC.serve_delete),
    _row("POST", f"{ENDPOINTS}{_ID}:deployModel", f"{EP}.deploy",
         _endpoint_verb(endpoints.deploy_model)),
    _row("POST", f"{ENDPOINTS}{_ID}:undeployModel", f"{EP}.undeploy",
         _endpoint_verb(endpoints.undeploy_model)),
    _row("POST", f"{ENDPOINTS}{_ID}:mutateDeployedModel", f"{EP}.update",
         _endpoint_verb(endpoints.mutate_deployed_model)),
    _row("POST", f"{ENDPOINTS}{_ID}:predict", f"{EP}.predict", _predict),
    _row("POST", f"{ENDPOINTS}{_ID}:rawPredict", f"{EP}.predict", _raw_predict),
)
