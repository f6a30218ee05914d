"""Job submission's subscriptions: what it does when an event arrives.

Every handler here schedules (``scheduling``): a job was submitted or requeued, a node came
back, a cluster became ready, or the periodic tick came (deadlines and the watchdog first).
Each decides from stored state and from the event's own fields, never from what another
service does with the same event, so the order in which the subscribers of one event run
does not matter (``services.wiring.routes``).
"""

from __future__ import annotations

from services.job_submission.adoption import on_job_adopted
from services.job_submission.scheduling import enforce_timeouts, schedule, watch_progress
from shared.domain.errors import NotFound
from shared.domain.events import (
    ClusterReady,
    FleetTicked,
    JobAdopted,
    JobRequeued,
    JobSubmitted,
    NodeReturnedToService,
)
from shared.domain.model import JobState
from shared.handling import Deps, Outcome
from shared.ports import UnitOfWork
from shared.service_layer import active_checks

SERVICE = "job_submission"


def on_job_submitted(event: JobSubmitted, uow: UnitOfWork, deps: Deps) -> None:
    job = uow.jobs.get(event.job_id)
    if job is None:
        raise NotFound("job", event.job_id)
    if job.state is JobState.QUEUED:
        job.transition(JobState.PENDING, deps.clock.now())
    schedule(event.cluster_id, uow, deps)


def on_job_requeued(event: JobRequeued, uow: UnitOfWork, deps: Deps) -> None:
    schedule(event.cluster_id, uow, deps)


def on_node_returned(event: NodeReturnedToService, uow: UnitOfWork, deps: Deps) -> None:
    schedule(event.cluster_id, uow, deps)


def on_cluster_ready(event: ClusterReady, uow: UnitOfWork, deps: Deps) -> None:
    schedule(event.cluster_id, uow, deps)


def on_fleet_ticked(event: FleetTicked, uow: UnitOfWork, deps: Deps) -> Outcome | None:
    """A timer, not a change: a tick that placed nothing (emitted nothing) is UNCHANGED, so
    the embedded bus keeps neither a timeline entry nor an idempotency record for it
    (scheduling is decided from state, so a repeated tick places nothing twice). Deadlines
    first: a job whose time is up is not started again by the same tick."""
    enforce_timeouts(event.cluster_id, uow, deps)
    watch_progress(event.cluster_id, uow, deps)
    schedule(event.cluster_id, uow, deps)
    # after placement: a check never takes a node a job could have this tick
    if active_checks.start_due(event.cluster_id, uow, deps):
        return None
    return Outcome.UNCHANGED


SUBSCRIPTIONS = {
    JobSubmitted: on_job_submitted,
    JobAdopted: on_job_adopted,
    JobRequeued: on_job_requeued,
    NodeReturnedToService: on_node_returned,
    ClusterReady: on_cluster_ready,
    FleetTicked: on_fleet_ticked,
}
