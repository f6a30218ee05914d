"""Cloud Function entry point for tuning: decode the CloudEvent, run the handler, answer."""

from __future__ import annotations

import functions_framework
from cloudevents.http import CloudEvent

from services.wiring.functions import handle_cloud_event


@functions_framework.cloud_event
def handle(cloud_event: CloudEvent) -> None:
    handle_cloud_event("tuning", cloud_event)
