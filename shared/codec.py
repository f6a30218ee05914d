"""CloudEvents 1.0 in and out: our envelopes, HTTP (structured and binary) and Pub/Sub.

On Pub/Sub we use the CloudEvents Pub/Sub protocol binding in binary mode: ``ce-*``
attributes and JSON data. A push subscription wraps the message in a
``google.cloud.pubsub.topic.v1.messagePublished`` event; ``decode`` unwraps it, so a
function receives the same event whichever way it arrived.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from cloudevents.http import CloudEvent

from shared.domain.errors import ValidationError
from shared.domain.events import Envelope, event_class

PUBSUB_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
SPEC_VERSION = "1.0"


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def _epoch(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or not value:
        raise ValidationError("time", "is required (RFC 3339)")
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise ValidationError("time", f"is not RFC 3339: {value!r}") from exc


def to_cloudevent(env: Envelope) -> CloudEvent:
    attributes = {
        "type": env.type,
        "source": env.source,
        "id": env.id,
        "time": _rfc3339(env.time),
        "specversion": SPEC_VERSION,
        "datacontenttype": "application/json",
    }
    if env.event.subject:
        attributes["subject"] = env.event.subject
    return CloudEvent(attributes, env.event.to_dict())


def from_attributes(attributes: Mapping[str, Any], data: Any) -> Envelope:
    for key in ("type", "source", "id"):
        if not attributes.get(key):
            raise ValidationError(key, "CloudEvent attribute is required")
    cls = event_class(str(attributes["type"]))
    if isinstance(data, bytes | bytearray):
        data = _json(bytes(data))
    return Envelope(event=cls.from_dict(data), id=str(attributes["id"]),
                    source=str(attributes["source"]), time=_epoch(attributes.get("time")))


def decode(event: CloudEvent) -> Envelope:
    """An mtc CloudEvent, or a Pub/Sub push wrapping one, into an envelope."""
    attributes = event.get_attributes()
    if attributes.get("type") == PUBSUB_PUBLISHED:
        return from_pubsub_message(_pubsub_message(event.get_data()))
    return from_attributes(attributes, event.get_data())


def _pubsub_message(data: Any) -> Mapping[str, Any]:
    if isinstance(data, bytes | bytearray):
        data = _json(bytes(data))
    if not isinstance(data, Mapping) or not isinstance(data.get("message"), Mapping):
        raise ValidationError("data.message", "a Pub/Sub push must carry a message")
    return data["message"]  # type: ignore[no-any-return]


def from_pubsub_message(message: Mapping[str, Any]) -> Envelope:
    attrs = message.get("attributes") or {}
    ce = {k[3:]: v for k, v in attrs.items() if k.startswith("ce-")}
    raw = message.get("data") or ""
    payload = base64.b64decode(raw) if isinstance(raw, str) else bytes(raw)
    return from_attributes(ce, payload)


def to_pubsub(env: Envelope) -> tuple[bytes, dict[str, str]]:
    """Binary mode: the data is the message body, every attribute a ``ce-`` attribute."""
    attrs = {
        "ce-specversion": SPEC_VERSION,
        "ce-type": env.type,
        "ce-source": env.source,
        "ce-id": env.id,
        "ce-time": _rfc3339(env.time),
        "content-type": "application/json",
    }
    if env.event.subject:
        attrs["ce-subject"] = env.event.subject
    return json.dumps(env.event.to_dict(), separators=(",", ":")).encode(), attrs


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode() or "null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError("data", f"is not JSON: {exc}") from exc
