"""Every Cloud Functions entry point, in one layer above the composition root.

Each function is registered with functions-framework under its own name (the deployed
``--entry-point``): one CloudEvent function per control-plane service, the Vertex AI REST API
(``api``) and the provisioning workflow's step endpoints (``steps``). A service's package
holds only its handlers, below the wiring; nothing there imports upward. The repository's
root ``main.py`` re-exports these names, because Cloud Functions loads ``main.py`` at the
root of the uploaded source; locally the same file serves them:

    functions-framework --source main.py --target api
"""

from __future__ import annotations

import flask
import functions_framework
from cloudevents.http import CloudEvent

from services.api.http import dispatch as api_dispatch
from services.observability.http import PATHS as OBSERVABILITY_PATHS
from services.provisioning.steps_api import dispatch as steps_dispatch
from services.wiring import runtime as rt
from shared import logs


@functions_framework.cloud_event
def provisioning(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("provisioning", cloud_event)


@functions_framework.cloud_event
def health_triage(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("health_triage", cloud_event)


@functions_framework.cloud_event
def repair(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("repair", cloud_event)


@functions_framework.cloud_event
def checkpoint_resume(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("checkpoint_resume", cloud_event)


@functions_framework.cloud_event
def job_submission(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("job_submission", cloud_event)


@functions_framework.cloud_event
def observability(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("observability", cloud_event)


@functions_framework.cloud_event
def tuning(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("tuning", cloud_event)


@functions_framework.cloud_event
def pipelines(cloud_event: CloudEvent) -> None:
    rt.handle_cloud_event("pipelines", cloud_event)


@functions_framework.http
def api(request: flask.Request) -> flask.Response:
    """The Vertex API, plus ``/metrics`` and ``/alerts.json`` (a token of any role); every
    line logged meanwhile carries the request's trace."""
    with logs.context(trace=logs.trace_field(logs.trace_id(dict(request.headers)))):
        if request.path in OBSERVABILITY_PATHS:
            return rt.observability().handle(request)  # type: ignore[no-any-return]
        return api_dispatch(request, rt.api_context())


@functions_framework.http
def steps(request: flask.Request) -> flask.Response:
    return steps_dispatch(request, rt.runtime())


# entry point -> signature: what cloudbuild.yaml deploys (deploy/cloudbuild.py)
ENTRY_POINTS: dict[str, str] = {
    "provisioning": "cloudevent",
    "health_triage": "cloudevent",
    "repair": "cloudevent",
    "checkpoint_resume": "cloudevent",
    "job_submission": "cloudevent",
    "observability": "cloudevent",
    "tuning": "cloudevent",
    "pipelines": "cloudevent",
    "api": "http",
    "steps": "http",
}
