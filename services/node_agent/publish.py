"""Publishing a HealthReport as a ``mtc.node.health_reported.v1`` CloudEvent.

Kept apart from detection so the agent is testable without a network and so the transport
(HTTP now, Pub/Sub later) can change without touching a probe. Binary mode: the attributes
travel as ``ce-*`` headers and the body is the JSON data, the same shape the Pub/Sub binding
uses, so a function receives the identical CloudEvent either way.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import requests
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from shared.domain.health import HealthReport

EVENT_TYPE = "mtc.node.health_reported.v1"

Publish = Callable[[CloudEvent], None]


def event_source(node_id: str) -> str:
    return f"//mtc/node-agent/{node_id}"


def report_data(report: HealthReport) -> dict[str, Any]:
    return {
        "node_id": report.node_id,
        "observed_at": report.observed_at,
        "source": report.source,
        "conditions": [c.to_dict() for c in report.conditions],
    }


def report_to_cloudevent(report: HealthReport, *, event_id: str | None = None) -> CloudEvent:
    """A fresh id per report: each is a new observation, dedup is by (source, id)."""
    attributes = {
        "type": EVENT_TYPE,
        "source": event_source(report.node_id),
        "id": event_id or str(uuid.uuid4()),
        "subject": report.node_id,
        "time": dt.datetime.fromtimestamp(report.observed_at, tz=dt.UTC).isoformat(),
        "datacontenttype": "application/json",
    }
    return CloudEvent(attributes, report_data(report))


def http_publisher(url: str, *, timeout_s: float = 10.0, session: requests.Session | None = None) -> Publish:
    """POST each event in binary mode; raises on a non-2xx answer so the caller can log it."""
    http = session or requests.Session()

    def publish(event: CloudEvent) -> None:
        headers, body = to_binary(event)
        response = http.post(url, headers=headers, data=body, timeout=timeout_s)
        response.raise_for_status()

    return publish
