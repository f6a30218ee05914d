"""Cloud Function entry points for job_submission: events (scheduling) and the Vertex AI API."""

from __future__ import annotations

import flask
import functions_framework
from cloudevents.http import CloudEvent

from services.api.http import dispatch
from services.wiring.functions import api_context, handle_cloud_event


@functions_framework.cloud_event
def handle(cloud_event: CloudEvent) -> None:
    handle_cloud_event("job_submission", cloud_event)


@functions_framework.http
def api(request: flask.Request) -> flask.Response:
    return dispatch(request, api_context())
