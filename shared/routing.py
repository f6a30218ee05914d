"""Which service handles which event type: the subscriptions, in one table.

On GCP each (service, event family) pair is a Pub/Sub push subscription; embedded, the bus
delivers each event to every service subscribed to its type.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from shared.domain.events import Event
from shared.handling import Handler

SERVICES = ("provisioning", "health_triage", "repair", "checkpoint_resume", "job_submission")


@functools.cache
def subscriptions(service: str) -> dict[str, Handler]:
    module: Any = importlib.import_module(f"services.{service}.handlers")
    table: dict[type[Event], Handler] = module.SUBSCRIPTIONS
    return {cls.TYPE: handler for cls, handler in table.items()}


@functools.cache
def subscribers(event_type: str) -> tuple[tuple[str, Handler], ...]:
    return tuple((service, subscriptions(service)[event_type]) for service in SERVICES
                 if event_type in subscriptions(service))


def families() -> dict[str, set[str]]:
    """Event family (topic) -> services subscribed to at least one of its types."""
    out: dict[str, set[str]] = {}
    for service in SERVICES:
        for type_ in subscriptions(service):
            out.setdefault(type_.split(".")[1], set()).add(service)
    return out
