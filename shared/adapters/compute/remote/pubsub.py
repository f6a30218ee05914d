"""Compute requests over Pub/Sub: the topic, the executor's ordered pull subscription.

``mtc-compute-requests`` carries every request (``codec``) with its ordering key; the
executor pulls from ``mtc-executor-<id>`` (message ordering on, so one node's requests
arrive in the order they were published). Refusals (a request past its deadline, a malformed one) go to the
dead-letter topic with the reason, beside what Pub/Sub itself forwards there after
``max_delivery_attempts``. Nothing here creates a client at import time.
"""

from __future__ import annotations

import contextlib
import queue
from collections.abc import Mapping
from typing import Any

from google.api_core import exceptions as gexc

from shared.adapters.compute.remote.bus import Delivery, Received
from shared.adapters.compute.remote.codec import ComputeRequest, encode, topic_id
from shared.adapters.pubsub import PREFIX, PubSubPublisher, dead_letter_topic_id, subscriber_client


def executor_subscription_id(executor_id: str, prefix: str = PREFIX) -> str:
    return f"{prefix}executor-{executor_id}"


def ordered_publisher_client() -> Any:
    """A publisher with message ordering on (PUBSUB_EMULATOR_HOST selects the emulator)."""
    from google.cloud.pubsub_v1 import PublisherClient, types

    return PublisherClient(
        batch_settings=types.BatchSettings(max_messages=100, max_latency=0.001),
        publisher_options=types.PublisherOptions(enable_message_ordering=True))


class PubSubRequestSink(PubSubPublisher):
    """``RequestSink``: publish with the request's ordering key and wait until Pub/Sub has
    it (or raise). Also the executor's refusals: to the dead-letter topic, with the reason."""

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = ordered_publisher_client()
        return self._client

    @property
    def topic(self) -> str:
        return self.topic_path(topic_id(self.prefix))

    def send(self, request: ComputeRequest) -> None:
        data, attributes = encode(request)
        future = self.client.publish(self.topic, data, ordering_key=request.ordering_key,
                                     **attributes)
        try:
            future.result(timeout=self.timeout_s)
        except Exception:
            # a failed publish pauses the key; resume it so the retry can go out
            with contextlib.suppress(Exception):
                self.client.resume_publish(self.topic, request.ordering_key)
            raise

    def refuse(self, data: bytes, attributes: Mapping[str, str], reason: str,
               service: str = "executor") -> None:
        self.publish_dead_letter(data, {**attributes, "mtc-service": service,
                                        "mtc-reason": reason[:1024]})


class PubSubRequestSource:
    """``RequestSource`` over a streaming pull of the executor's subscription: the client
    library hands messages over (one key's in order) as they arrive, and ``receive`` waits
    on that hand-over, so a request is applied within milliseconds of its publish and an
    idle executor does not spin. ``max_outstanding`` bounds what is held unacknowledged."""

    def __init__(self, project: str, subscription: str, *, subscriber: Any = None,
                 max_outstanding: int = 100) -> None:
        self.subscriber = subscriber or subscriber_client()
        self.path = self.subscriber.subscription_path(project, subscription)
        self.max_outstanding = max_outstanding
        self._arrived: queue.Queue[Any] = queue.Queue()
        self._future: Any = None

    def _stream(self) -> None:
        if self._future is None or self._future.done():
            from google.cloud.pubsub_v1 import types

            self._future = self.subscriber.subscribe(
                self.path, callback=self._arrived.put,
                flow_control=types.FlowControl(max_messages=self.max_outstanding))

    def receive(self, max_messages: int, timeout_s: float) -> list[Delivery]:
        self._stream()
        out: list[Delivery] = []
        try:
            message = self._arrived.get(timeout=timeout_s) if timeout_s > 0 else \
                self._arrived.get_nowait()
            while True:
                out.append(Received(bytes(message.data), dict(message.attributes),
                                    message.ordering_key, message.delivery_attempt or 1,
                                    message.ack, message.nack))
                if len(out) >= max_messages:
                    break
                message = self._arrived.get_nowait()
        except queue.Empty:
            pass
        return out

    def close(self) -> None:
        if self._future is not None:
            self._future.cancel()
            with contextlib.suppress(Exception):
                self._future.result(timeout=10)


def ensure_request_topology(project: str, executor_id: str, *, prefix: str = PREFIX,
                            ack_deadline_s: int = 60, max_delivery_attempts: int = 10,
                            publisher: Any = None, subscriber: Any = None) -> str:
    """The requests topic, the dead-letter topic and the executor's ordered pull
    subscription (dead-lettered after ``max_delivery_attempts``). Idempotent; returns the
    subscription id. In production the deployment creates them (cloudbuild.yaml) and the
    executor's least-privilege identity may not: a refusal (403) means "already there"."""
    pub = publisher or ordered_publisher_client()
    sub = subscriber or subscriber_client()
    topic = pub.topic_path(project, topic_id(prefix))
    dead = pub.topic_path(project, dead_letter_topic_id(prefix))
    for path in (topic, dead):
        with contextlib.suppress(gexc.AlreadyExists, gexc.Forbidden):
            pub.create_topic(request={"name": path})
    name = executor_subscription_id(executor_id, prefix)
    with contextlib.suppress(gexc.AlreadyExists, gexc.Forbidden):
        sub.create_subscription(request={
            "name": sub.subscription_path(project, name), "topic": topic,
            "ack_deadline_seconds": ack_deadline_s, "enable_message_ordering": True,
            "dead_letter_policy": {"dead_letter_topic": dead,
                                   "max_delivery_attempts": max_delivery_attempts}})
    return name
