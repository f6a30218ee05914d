"""Observability: on every fleet tick, note the tick and evaluate the alert rules.

``FleetTicked`` (``mtc serve``/``mtc controller`` every few seconds, Cloud Scheduler's
``mtc-tick`` on Google Cloud) records when the controller last ticked (the
``controller_ticks`` collection, one document per cluster: what ``/metrics`` and
``/alerts.json`` read for controller liveness), then evaluates the rules of
``services.observability.alerts`` over the cluster's nodes and jobs (and the dead letters),
reconciles them with the ``alerts`` collection and emits one ``AlertRaised`` per
notification due. Deliveries are deduplicated by that stored state, so a held repair
ticked over a thousand times is sent once (then on a change, a reminder, its resolution).

Idempotent under redelivery: the rules read state, and a notification already recorded as
sent is not due again; a tick that changes nothing but the tick record is UNCHANGED.
"""

from __future__ import annotations

from typing import Any

from services.observability import alerts
from shared.domain.events import AlertRaised, Event, FleetTicked
from shared.domain.model import JobState, NodeState
from shared.handling import Deps, Outcome
from shared.policies.rollout import ROLLOUTS
from shared.ports import UnitOfWork

SERVICE = "observability"
DEAD_LETTERS = "dead_letters"  # shared.adapters.outbox_bus.DEAD_LETTERS (no adapter import here)
# the node states the node rules read: one query each, the healthy majority is never loaded
_NODE_STATES = (NodeState.SUSPECT, NodeState.FAILED, NodeState.RETIRED)
_JOB_STATES = (JobState.RUNNING, JobState.PENDING, JobState.CANCELLING)


def on_fleet_ticked(event: FleetTicked, uow: UnitOfWork, deps: Deps) -> Outcome | None:
    now = deps.clock.now()
    records: Any = uow
    records.put_record(alerts.CONTROLLER_TICKS, event.cluster_id,
                       {"cluster_id": event.cluster_id, "at": now})
    config = deps.config
    nodes = [n for state in _NODE_STATES for n in uow.nodes.list(event.cluster_id, state=state)]
    jobs = [j for state in _JOB_STATES for j in uow.jobs.list(event.cluster_id, state=state)]
    active = alerts.node_alerts(nodes, now) + alerts.domain_alerts(
        uow.partitions.list(event.cluster_id)) + alerts.job_alerts(
        jobs, now, config.progress_timeout_s, config.progress_interval_factor) + \
        alerts.rollout_alerts(records.records(ROLLOUTS, {"cluster_id": event.cluster_id}), now)
    stored = records.records(alerts.ALERTS, {"cluster_id": event.cluster_id})
    plans = [alerts.reconcile(active, stored, now, reminder_s=config.alert_reminder_s,
                              retention_s=config.retention_s, kinds=alerts.cluster_kinds())]
    dead = alerts.dead_letter_alert(len(records.records(DEAD_LETTERS, {})))
    plans.append(alerts.reconcile([dead] if dead else [], records.records(
        alerts.ALERTS, {"cluster_id": ""}), now, reminder_s=config.alert_reminder_s,
        retention_s=config.retention_s, kinds=alerts.global_kinds()))
    for plan in plans:
        for doc_id, doc in plan.writes.items():
            records.put_record(alerts.ALERTS, doc_id, doc)
        for doc_id in plan.deletes:
            records.delete_record(alerts.ALERTS, doc_id)
        for doc in plan.sends:
            uow.emit(AlertRaised(kind=doc["kind"], target=doc["subject"], state=doc["state"],
                                 severity=doc["severity"], summary=doc["summary"],
                                 first_at=doc["first_at"], sent=doc["sent"],
                                 cluster_id=doc["cluster_id"], node_id=doc["node_id"],
                                 job_id=doc["job_id"]))
    return None if uow.emitted else Outcome.UNCHANGED


SUBSCRIPTIONS: dict[type[Event], Any] = {
    FleetTicked: on_fleet_ticked,
}
