"""Cloud Function entry points for job_submission: events (scheduling) and the Vertex AI API."""

from __future__ import annotations

import flask
import functions_framework
from cloudevents.http import CloudEvent

from services.api.http import dispatch
from services.observability.http import PATHS
from services.wiring.functions import api_context, handle_cloud_event, observability
from shared import logs


@functions_framework.cloud_event
def handle(cloud_event: CloudEvent) -> None:
    handle_cloud_event("job_submission", cloud_event)


@functions_framework.http
def api(request: flask.Request) -> flask.Response:
    """The Vertex API, plus ``/metrics`` and ``/alerts.json`` (a token of any role); every
    line logged meanwhile carries the request's trace."""
    with logs.context(trace=logs.trace_field(logs.trace_id(dict(request.headers)))):
        if request.path in PATHS:
            return observability().handle(request)  # type: ignore[no-any-return]
        return dispatch(request, api_context())
