"""Pub/Sub: the publisher port, the delivery topology and the outbox sweeper.

- One topic per event family (``mtc-<family>``: cluster, node, job, fleet), so a service
  subscribes to the families it handles, not to every event.
- Messages use the CloudEvents Pub/Sub binding in binary mode (``shared.codec.to_pubsub``:
  ``ce-*`` attributes, JSON data); a push subscription delivers them to a function's HTTP
  endpoint, where functions-framework turns the push into a CloudEvent and
  ``shared.codec.decode`` unwraps it.
- One push subscription per (service, family), with an ack deadline, a retry policy
  (exponential backoff between redeliveries) and a dead-letter policy: after
  ``max_delivery_attempts`` failed deliveries (the function answered 5xx) the message goes to
  ``mtc-dead-letter``. Events that fail permanently (malformed, invalid transition) are
  acknowledged by ``run_handler`` and published to the same topic by
  :class:`PubSubDeadLetters`, with the reason.
- Subscriptions carry a filter on ``ce-type`` where it fits Pub/Sub's 256-byte limit. The
  emulator stores filters but does not apply them, so functions ignore types they do not
  handle anyway (``services.wiring.runtime.handle_cloud_event`` answers "ignored").

Nothing here creates a client at import time.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc

from shared.adapters.outbox import doc_id as _doc_id
from shared.adapters.outbox_bus import DocDeadLetters
from shared.codec import to_pubsub
from shared.domain.events import Envelope
from shared.handling import Routes
from shared.ports import DocStore

log = logging.getLogger("mtc.pubsub")

PREFIX = "mtc-"
DEAD_LETTER = "dead-letter"
FILTER_LIMIT = 256  # bytes: Pub/Sub rejects longer subscription filters


def topic_id(family: str, prefix: str = PREFIX) -> str:
    return f"{prefix}{family}"


def alerts_topic_id(prefix: str = PREFIX) -> str:
    """``mtc-alerts``: every ``mtc.alerts.raised.v1`` (its family), for people to subscribe
    to; no control-plane service does, so it is created beside the family topics."""
    return topic_id("alerts", prefix)


def dead_letter_topic_id(prefix: str = PREFIX) -> str:
    return f"{prefix}{DEAD_LETTER}"


def dead_letter_subscription_id(prefix: str = PREFIX) -> str:
    return f"{prefix}{DEAD_LETTER}-sub"


def subscription_id(service: str, family: str, prefix: str = PREFIX) -> str:
    return f"{prefix}{service.replace('_', '-')}-{family}"


def function_name(service: str, prefix: str = PREFIX) -> str:
    """The deployed Cloud Function (and its service account) for a service."""
    return f"{prefix}{service.replace('_', '-')}"


def message_filter(types: Iterable[str]) -> str:
    """A Pub/Sub filter accepting these CloudEvent types, or "" when it would be too long."""
    clauses = [f'attributes."ce-type" = "{t}"' for t in sorted(types)]
    text = " OR ".join(clauses)
    return text if len(text.encode()) <= FILTER_LIMIT else ""


@dataclass(frozen=True)
class SubscriptionPlan:
    """One push subscription: a service's share of one family's topic."""

    name: str
    topic: str
    service: str
    family: str
    types: tuple[str, ...]

    @property
    def filter(self) -> str:
        return message_filter(self.types)


@dataclass(frozen=True)
class DeliverySettings:
    """How a push subscription retries a delivery the function answered 5xx. Only transient
    failures get there (``run_handler`` acknowledges permanent ones), so the attempts are a
    time budget for the store to recover, not a poison-message detector: a message
    dead-lettered on contention can be a job's exit, and that job then never ends."""

    ack_deadline_s: int = 60  # the function's timeout: an unanswered push is redelivered
    max_delivery_attempts: int = 20  # Pub/Sub allows 5..100
    min_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    retention_s: int = 7 * 24 * 3600

    def retry_budget_s(self) -> float:
        """The backoff between the first delivery and the last, at Pub/Sub's exponential
        retry policy (doubling from the minimum up to the maximum): how long a transient
        failure may last before the message is dead-lettered (handler time not counted)."""
        return float(sum(min(self.max_backoff_s, self.min_backoff_s * 2.0 ** i)
                         for i in range(self.max_delivery_attempts - 1)))


def plan_subscriptions(routes: Routes, prefix: str = PREFIX) -> list[SubscriptionPlan]:
    """Every (service, family) pair of the routes: the whole delivery topology."""
    plans = []
    for service in routes.services:
        by_family: dict[str, list[str]] = {}
        for type_ in routes.subscriptions(service):
            by_family.setdefault(type_.split(".")[1], []).append(type_)
        for family, types in sorted(by_family.items()):
            plans.append(SubscriptionPlan(subscription_id(service, family, prefix),
                                          topic_id(family, prefix), service, family,
                                          tuple(sorted(types))))
    return plans


def topics(routes: Routes, prefix: str = PREFIX) -> list[str]:
    return sorted(topic_id(f, prefix) for f in routes.families())


# ---------------------------------------------------------------- publishing


def publisher_client() -> Any:
    """PUBSUB_EMULATOR_HOST, when set, selects the emulator."""
    from google.cloud.pubsub_v1 import PublisherClient, types

    batch = types.BatchSettings(max_messages=100, max_latency=0.001)
    return PublisherClient(batch_settings=batch)


def subscriber_client() -> Any:
    from google.cloud.pubsub_v1 import SubscriberClient

    return SubscriberClient()


class PubSubPublisher:
    """The ``Publisher`` port: each envelope to its family's topic, binary mode.

    ``publish`` returns once Pub/Sub has accepted the message (or raises), so
    ``run_handler`` removes an event from the outbox only after it is really published."""

    def __init__(self, project: str, *, client: Any = None, prefix: str = PREFIX,
                 timeout_s: float = 30.0) -> None:
        self.project = project
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = publisher_client()
        return self._client

    def topic_path(self, topic: str) -> str:
        return f"projects/{self.project}/topics/{topic}"

    def publish(self, envelope: Envelope) -> None:
        data, attributes = to_pubsub(envelope)
        topic = self.topic_path(topic_id(envelope.event.family, self.prefix))
        self.client.publish(topic, data, **attributes).result(timeout=self.timeout_s)

    def publish_many(self, envelopes: Sequence[Envelope]) -> None:
        """Publish in one batch and wait for all (tools and benchmarks)."""
        futures = []
        for env in envelopes:
            data, attributes = to_pubsub(env)
            topic = self.topic_path(topic_id(env.event.family, self.prefix))
            futures.append(self.client.publish(topic, data, **attributes))
        for future in futures:
            future.result(timeout=self.timeout_s)

    def publish_dead_letter(self, data: bytes, attributes: Mapping[str, str]) -> None:
        topic = self.topic_path(dead_letter_topic_id(self.prefix))
        self.client.publish(topic, data, **attributes).result(timeout=self.timeout_s)


class PubSubDeadLetters:
    """Permanent failures: recorded in Firestore (``dead_letters``) and published to the
    dead-letter topic with the reason, beside what Pub/Sub itself forwards there."""

    def __init__(self, store: DocStore, publisher: PubSubPublisher) -> None:
        self._docs = DocDeadLetters(store)
        self._publisher = publisher

    def dead_letter(self, envelope: Envelope | None, service: str, reason: str,
                    raw: Any = None) -> None:
        self._docs.dead_letter(envelope, service, reason, raw)
        extra = {"mtc-service": service, "mtc-reason": reason[:1024]}
        if envelope is not None:
            data, attributes = to_pubsub(envelope)
            attributes = {**attributes, **extra}
        else:
            data = json.dumps({"raw": repr(raw)[:4000]}).encode()
            attributes = extra
        try:
            self._publisher.publish_dead_letter(data, attributes)
        except gexc.GoogleAPICallError as exc:  # the Firestore record is already there
            log.warning("could not publish dead letter for %s: %s", service, exc)

    def list(self) -> list[dict[str, Any]]:
        return self._docs.list()


# ---------------------------------------------------------------- topology


def _create_topic(pub: Any, path: str) -> None:
    with contextlib.suppress(gexc.AlreadyExists):
        pub.create_topic(request={"name": path})


def ensure_topology(project: str, endpoints: Mapping[str, str], routes: Routes, *,
                    settings: DeliverySettings | None = None, prefix: str = PREFIX,
                    publisher: Any = None, subscriber: Any = None) -> list[SubscriptionPlan]:
    """Topics, the dead-letter topic and its pull subscription, and one push subscription per
    (service, family) to ``endpoints[service]``. Idempotent: existing subscriptions get the
    endpoint and policies of this call."""
    from google.cloud.pubsub_v1 import types
    from google.protobuf import duration_pb2, field_mask_pb2

    settings = settings or DeliverySettings()
    pub = publisher or publisher_client()
    sub = subscriber or subscriber_client()
    for topic in {*topics(routes, prefix), alerts_topic_id(prefix)}:
        _create_topic(pub, pub.topic_path(project, topic))
    dead_topic = pub.topic_path(project, dead_letter_topic_id(prefix))
    _create_topic(pub, dead_topic)
    with contextlib.suppress(gexc.AlreadyExists):
        sub.create_subscription(request={
            "name": sub.subscription_path(project, dead_letter_subscription_id(prefix)),
            "topic": dead_topic, "ack_deadline_seconds": 60,
            "message_retention_duration": duration_pb2.Duration(seconds=settings.retention_s),
        })

    def seconds(value: float) -> duration_pb2.Duration:
        return duration_pb2.Duration(seconds=int(value), nanos=int(value % 1 * 1e9))

    plans = [p for p in plan_subscriptions(routes, prefix) if p.service in endpoints]
    for plan in plans:
        subscription = types.Subscription(
            name=sub.subscription_path(project, plan.name),
            topic=pub.topic_path(project, plan.topic),
            push_config=types.PushConfig(push_endpoint=endpoints[plan.service]),
            ack_deadline_seconds=settings.ack_deadline_s,
            retry_policy=types.RetryPolicy(
                minimum_backoff=seconds(settings.min_backoff_s),
                maximum_backoff=seconds(settings.max_backoff_s)),
            dead_letter_policy=types.DeadLetterPolicy(
                dead_letter_topic=dead_topic,
                max_delivery_attempts=settings.max_delivery_attempts),
            filter=plan.filter,
        )
        try:
            sub.create_subscription(request=subscription)
        except gexc.AlreadyExists:
            mask = field_mask_pb2.FieldMask(paths=[
                "push_config", "ack_deadline_seconds", "retry_policy", "dead_letter_policy"])
            sub.update_subscription(request={"subscription": subscription,
                                              "update_mask": mask})
    return plans


def tap(project: str, name: str, routes: Routes, *, prefix: str = PREFIX,
        subscriber: Any = None) -> list[str]:
    """Pull subscriptions ``<prefix>tap-<name>-<family>`` on every family topic: a read-only
    view of the traffic for timelines and benchmarks. Returns their paths."""
    sub = subscriber or subscriber_client()
    paths = []
    for topic in topics(routes, prefix):
        family = topic[len(prefix):]
        path = sub.subscription_path(project, f"{prefix}tap-{name}-{family}")
        with contextlib.suppress(gexc.AlreadyExists):
            sub.create_subscription(request={
                "name": path, "topic": f"projects/{project}/topics/{topic}",
                "ack_deadline_seconds": 60})
        paths.append(path)
    return paths


def pull(subscription_path: str, *, max_messages: int = 100, timeout_s: float = 5.0,
         subscriber: Any = None) -> list[Any]:
    """Pull and acknowledge what is there now (tools and tests)."""
    sub = subscriber or subscriber_client()
    try:
        response = sub.pull(request={"subscription": subscription_path,
                                     "max_messages": max_messages}, timeout=timeout_s)
    except gexc.DeadlineExceeded:
        return []
    received = list(response.received_messages)
    if received:
        sub.acknowledge(request={"subscription": subscription_path,
                                 "ack_ids": [m.ack_id for m in received]})
    return [m.message for m in received]


def dead_letter_key(envelope: Envelope, service: str) -> str:
    """The Firestore id of a permanent failure's record (as ``DocDeadLetters`` writes it)."""
    return _doc_id(f"{service}:{envelope.key}")
