"""Cloud Function entry point for observability: the fleet tick's alert rules."""

from __future__ import annotations

import functions_framework
from cloudevents.http import CloudEvent

from services.wiring.functions import handle_cloud_event


@functions_framework.cloud_event
def handle(cloud_event: CloudEvent) -> None:
    handle_cloud_event("observability", cloud_event)
