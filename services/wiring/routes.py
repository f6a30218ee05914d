"""Which service handles which event type: the subscriptions, in one table.

On GCP each (service, event family) pair is a Pub/Sub push subscription; embedded and in the
twin, the bus delivers each event to every service subscribed to its type. The table is built
here, from each service's ``SUBSCRIPTIONS``, and handed to the buses: no bus imports a service.

Delivery order is not part of the contract. Pub/Sub runs the subscribers of one event in no
order, so every handler is correct in any: each decides from the state it reads in its own
transaction and from the event's own fields, and learns what another service did with the
same event from that service's own events. Tuning may read a trial's job before or after
job_submission's tick fails it (a job timed out between attempts): the ``JobFinished`` that
the tick emits brings tuning back. Observability's alert rules are levels, read again on every
tick. The embedded bus and the twin keep this table's order only so that their runs are
reproducible (the twin's goldens). ``tests/unit/handlers/test_delivery_order.py`` shuffles
the subscribers of every event and checks the end state; ``docs/gcp.md`` says why per handler.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from services.checkpoint_resume import handlers as checkpoint_resume
from services.health_triage import handlers as health_triage
from services.job_submission import handlers as job_submission
from services.observability import handlers as observability
from services.pipelines import handlers as pipelines
from services.provisioning import handlers as provisioning
from services.repair import handlers as repair
from services.repair import rollout
from services.tuning import handlers as tuning
from shared.domain.events import Event
from shared.handling import Handler, Routes

_MODULES: dict[str, Mapping[Any, Any]] = {  # event class -> handler, per service
    "provisioning": provisioning.SUBSCRIPTIONS,
    "health_triage": health_triage.SUBSCRIPTIONS,
    # (software rollouts take nodes out of service as repairs do: the repair service's)
    "repair": {**repair.SUBSCRIPTIONS, **rollout.SUBSCRIPTIONS},
    "checkpoint_resume": checkpoint_resume.SUBSCRIPTIONS,
    "job_submission": job_submission.SUBSCRIPTIONS,
    "pipelines": pipelines.SUBSCRIPTIONS,  # the model upload when a pipeline's job ends
    "tuning": tuning.SUBSCRIPTIONS,
    "observability": observability.SUBSCRIPTIONS,
}
SERVICES = tuple(_MODULES)


def _by_type(table: Mapping[type[Event], Any]) -> dict[str, Handler]:
    return {cls.TYPE: handler for cls, handler in table.items()}


@functools.cache
def control_plane_routes() -> Routes:
    """The control-plane services; the embedded bus and the twin deliver in this order."""
    return Routes({service: _by_type(table) for service, table in _MODULES.items()})


def subscriptions(service: str) -> dict[str, Handler]:
    return control_plane_routes().subscriptions(service)


def subscribers(event_type: str) -> tuple[tuple[str, Handler], ...]:
    return control_plane_routes().subscribers(event_type)


def families() -> dict[str, set[str]]:
    return control_plane_routes().families()
