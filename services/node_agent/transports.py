"""Where the agent's spooled reports go: Pub/Sub, the mtc API, or a CloudEvent endpoint.

Every transport sends one ``SpooledReport`` synchronously and raises when it was not
accepted, so the spool keeps it. Each keeps the report's event id and its ORIGINAL
observation time (CloudEvent ``time`` = ``observed_at``), however late it is sent.

- ``pubsub``: the ``mtc-node`` topic, CloudEvents Pub/Sub binding in binary mode (``ce-*``
  attributes, JSON data), the shape the functions' push subscriptions decode. The client
  uses the machine's own identity (google-auth Application Default Credentials: the VM's
  service account from the metadata server); no key file is read or needed. With
  ``PUBSUB_EMULATOR_HOST`` set the client talks to the emulator instead. The synchronous GAPIC
  call (no background batching, no retry) is used so "accepted" means the server answered.
- ``api``: ``POST v1beta1/{cluster}/nodes/{node}:reportHealth`` on ``mtc serve`` with a
  bearer token read from a file that must be private (mode 0600 or stricter) on each send, so
  a rotated token is picked up without a restart.
- ``url``: POST a binary-mode CloudEvent to any URL (tests, a function's endpoint).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import requests

from services.node_agent.publish import EVENT_TYPE, event_source, http_publisher
from services.node_agent.spool import Send, SpooledReport
from shared.domain import validation
from shared.domain.errors import ValidationError

TRANSPORTS = ("none", "url", "pubsub", "api")
NODE_TOPIC = "mtc-node"  # shared.adapters.pubsub.topic_id("node")


@dataclass(frozen=True)
class DeliveryConfig:
    """How reports leave the node (the ``delivery`` object of the agent's config file)."""

    transport: str = "none"
    spool_path: str = ""  # "" = no spool: send once, drop on failure (only for --once runs)
    spool_max_reports: int = 10_000
    spool_max_bytes: int = 16 * 1024 * 1024
    url: str = ""  # transport "url"
    project: str = ""  # transport "pubsub" ("" = GOOGLE_CLOUD_PROJECT / the ADC project)
    topic: str = NODE_TOPIC
    api_url: str = ""  # transport "api": http://127.0.0.1:8080
    cluster: str = ""  # transport "api": projects/p/locations/l/modelDevelopmentClusters/c
    token_file: str = ""  # transport "api"
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValidationError("delivery.transport", f"must be one of {list(TRANSPORTS)}")
        need = {"url": ("url",), "api": ("api_url", "cluster", "token_file")}
        for name in need.get(self.transport, ()):
            if not getattr(self, name):
                raise ValidationError(f"delivery.{name}", f"is required for {self.transport}")
        if self.timeout_s <= 0:
            raise ValidationError("delivery.timeout_s", "must be positive")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeliveryConfig:
        data = validation.mapping(data, "delivery", noun="a JSON object")
        validation.only_keys(data, "delivery", (f.name for f in fields(cls)))  # typos too
        return cls(**data)


def event_time(report: SpooledReport) -> str:
    return dt.datetime.fromtimestamp(report.observed_at, tz=dt.UTC).isoformat()


def cloudevent_attributes(report: SpooledReport) -> dict[str, str]:
    return {"type": EVENT_TYPE, "source": event_source(report.node_id), "id": report.event_id,
            "subject": report.node_id, "time": event_time(report),
            "datacontenttype": "application/json"}


def url_sender(url: str, timeout_s: float = 10.0) -> Send:
    from cloudevents.http import CloudEvent

    publish = http_publisher(url, timeout_s=timeout_s)

    def send(report: SpooledReport) -> None:
        publish(CloudEvent(cloudevent_attributes(report), dict(report.data)))

    return send


def pubsub_sender(project: str, topic: str = NODE_TOPIC, timeout_s: float = 10.0) -> Send:
    """Publish through Pub/Sub with Application Default Credentials (or the emulator)."""
    from google.cloud import pubsub_v1  # the agent extra; imported only when used

    state: dict[str, Any] = {}

    def client() -> Any:
        if "client" not in state:
            state["client"] = pubsub_v1.PublisherClient()
            proj = project or _adc_project()
            state["topic"] = state["client"].topic_path(proj, topic)
        return state["client"]

    def send(report: SpooledReport) -> None:
        publisher = client()
        attrs = {f"ce-{k}": v for k, v in cloudevent_attributes(report).items()
                 if k != "datacontenttype"}
        attrs["content-type"] = "application/json"
        message = pubsub_v1.types.PubsubMessage(
            data=json.dumps(dict(report.data), separators=(",", ":")).encode(), attributes=attrs)
        try:
            publisher.api.publish(topic=state["topic"], messages=[message], retry=None,
                                  timeout=timeout_s)
        except Exception:
            state.clear()  # a fresh channel next time, not gRPC's growing reconnect backoff
            raise

    return send


def _adc_project() -> str:
    env = os.environ.get("GOOGLE_CLOUD_PROJECT", "")
    if env:
        return env
    import google.auth

    _, found = google.auth.default()
    if not found:
        raise ValidationError("delivery.project", "not set and the machine's credentials "
                              "name no project")
    return str(found)


def read_token(path: str) -> str:
    """The bearer token, from a file only its owner can read (refused otherwise)."""
    info = os.stat(path)
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PermissionError(f"{path} is readable by others (mode {info.st_mode & 0o777:o}); "
                              "chmod 600 it")
    with open(path, encoding="utf-8") as handle:
        token = handle.read().strip()
    if not token:
        raise ValueError(f"{path} is empty")
    return token


def api_body(report: SpooledReport) -> dict[str, Any]:
    """The reportHealth request for an agent's own report (proto3 JSON, camelCase)."""
    def ts(value: float) -> str:
        return dt.datetime.fromtimestamp(value, tz=dt.UTC).isoformat().replace("+00:00", "Z")

    return {
        "reportId": report.event_id,
        "observedAt": ts(report.observed_at),
        "conditions": [
            {"type": c["type"], "status": str(c["status"]).upper(), "reason": c.get("reason", ""),
             "since": ts(float(c.get("since", report.observed_at))),
             "details": c.get("details") or {}}
            for c in report.data.get("conditions", ())
        ],
    }


def api_sender(api_url: str, cluster: str, token_file: str, timeout_s: float = 10.0,
               session: requests.Session | None = None) -> Send:
    http = session or requests.Session()
    base = api_url.rstrip("/")

    def send(report: SpooledReport) -> None:
        url = f"{base}/v1beta1/{cluster}/nodes/{report.node_id}:reportHealth"
        headers = {"Authorization": f"Bearer {read_token(token_file)}"}
        response = http.post(url, json=api_body(report), headers=headers, timeout=timeout_s)
        if response.status_code >= 400:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")

    return send


def sender(config: DeliveryConfig, url_override: str | None = None) -> Send | None:
    """The configured transport, or None (transport "none" without --publish-url)."""
    if url_override:
        return url_sender(url_override, config.timeout_s)
    if config.transport == "url":
        return url_sender(config.url, config.timeout_s)
    if config.transport == "pubsub":
        return pubsub_sender(config.project, config.topic, config.timeout_s)
    if config.transport == "api":
        return api_sender(config.api_url, config.cluster, config.token_file, config.timeout_s)
    return None
