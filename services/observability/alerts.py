"""Alert rules and their deduplication (pure: entities and time in, alerts and plans out).

What needs a person is read from state, not from a stream of events, so a rule asked a
thousand times says the same thing a thousand times; *delivery* is what is deduplicated. One
alert per (kind, subject), stored in the ``alerts`` collection (:func:`reconcile` plans the
writes): sent when it first fires, again when its summary changes (the fault, the reason,
the count) or, for the kinds that wait on a person, after ``alert_reminder_s``; once more
when it resolves; then deleted ``retention_s`` after it resolved.

Kinds (``KINDS``):

- ``repair_held``: the blast-radius guard kept a sick node in service (SUSPECT, its alert
  key ``held:...``) because too many of its partition's nodes are out already;
- ``node_failed``: a FAILED node waits for a person (a MANUAL action, or the repair ladder
  ran out);
- ``lemon``: a node failed too often and was replaced (once; no reminder);
- ``rack_drained``: a rack was drained to be repaired as one (racks as a unit of failure,
  ``shared.policies.domains``): one alert for the rack, not one per node; resolves when its
  last node is back in service;
- ``rack_held``: the guard per domain held a rack that should have been drained (too many
  racks of its partition out already); its nodes are repaired one by one meanwhile;
- ``job_no_progress``: the progress watchdog found a running job silent past its limit
  (``shared.domain.progress``), or is stopping it for that;
- ``job_storage_full``: a full disk ended a job's attempt and the job waits for room on the
  file system of its files (``shared.domain.storage``); resolves when it has room again;
- ``rollout_rolled_back``: a software rollout regressed (its updated nodes failed the
  deep-check gate or faulted above the fleet's rate) and was paused and rolled back
  (``services.repair.rollout``); sent when it pauses and again when the rollback is done,
  resolved a day later;
- ``dead_letters``: events the control plane gave up on are waiting in the dead-letter
  collection;
- ``controller_unreachable``: no fleet tick for ``controller_stale_s``. A stopped controller
  cannot deliver its own alert: this one is evaluated by readers (``/alerts.json``, the
  ``mtc_controller_last_tick_age_seconds`` gauge, a Prometheus rule), never by the tick.
  On the embedded default the machines are polled by that same controller, so its tick age
  is also the machines' liveness;
- ``executor_silent``: in the cloud topology the machines are driven by executors
  (``services.executor``), each overwriting ``executors/<id>`` with its ``last_seen``
  every few seconds (state, not events). One silent past ``executor_stale_s`` raises this
  alert, evaluated by readers like the controller's. It never drains or repairs anything:
  a silent executor means requests wait (and past their deadline are refused), not that
  the machines are sick.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain import progress
from shared.domain.model import Job, JobState, Node, NodeRole, NodeState, Partition

ALERTS = "alerts"
CONTROLLER_TICKS = "controller_ticks"
FIRING, RESOLVED = "firing", "resolved"
LEMON_ALERT_S = 24 * 3600.0  # a lemon's replacement is news for a day
CONTROLLER_STALE_S = 180.0  # no tick for this long: the controller is unreachable
EXECUTORS = "executors"  # one liveness document per executor (services.executor)
EXECUTOR_STALE_S = 60.0  # no liveness write for this long: the executor is silent


@dataclass(frozen=True)
class Kind:
    severity: str  # Cloud Logging's names
    remind: bool  # whether it is sent again every ``alert_reminder_s`` while it fires
    scope: str  # "cluster": evaluated per cluster tick; "global": once for all; "reader"
    description: str


KINDS: dict[str, Kind] = {
    "repair_held": Kind("WARNING", True, "cluster",
                        "the blast-radius guard held a repair: a sick node stays in service"),
    "node_failed": Kind("ERROR", True, "cluster", "a FAILED node waits for a person"),
    "lemon": Kind("WARNING", False, "cluster", "a node failed too often and was replaced"),
    "rack_drained": Kind("WARNING", False, "cluster",
                         "a rack was drained to be repaired as one (a shared cause)"),
    "rack_held": Kind("WARNING", True, "cluster",
                      "the guard per domain held a rack drain: its nodes go one by one"),
    "job_no_progress": Kind("WARNING", True, "cluster",
                            "a running job made no progress past its watchdog limit"),
    "job_storage_full": Kind("WARNING", True, "cluster",
                             "a job waits for room on the full disk that holds its files"),
    "rollout_rolled_back": Kind("ERROR", False, "cluster",
                                "a software rollout regressed and was rolled back"),
    "dead_letters": Kind("ERROR", True, "global",
                         "events the control plane gave up on wait in the dead letters"),
    "controller_unreachable": Kind("CRITICAL", True, "reader",
                                   "no fleet tick: the controller is not running"),
    "executor_silent": Kind("CRITICAL", True, "reader",
                            "a compute executor stopped reporting: compute requests wait"),
}


@dataclass(frozen=True)
class Alert:
    kind: str
    subject: str
    summary: str
    cluster_id: str = ""
    node_id: str = ""
    job_id: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.subject}"

    @property
    def severity(self) -> str:
        return KINDS[self.kind].severity


def alert_id(kind: str, subject: str) -> str:
    """The store id of (kind, subject): hashed (Firestore ids cannot hold '/')."""
    return hashlib.sha256(f"{kind}:{subject}".encode()).hexdigest()[:40]


# ---------------------------------------------------------------- rules


def held(node: Node) -> bool:
    return node.state is NodeState.SUSPECT and node.alert.startswith("held:")


def lemon(node: Node) -> bool:
    return node.state is NodeState.RETIRED and "lemon" in node.reason


def node_alerts(nodes: Iterable[Node], now: float) -> list[Alert]:
    out = []
    for node in nodes:
        if node.role is NodeRole.LOGIN:
            continue
        if held(node):
            kind, summary = "repair_held", f"node {node.node_id}: repair held: {node.reason}"
        elif node.state is NodeState.FAILED:
            kind, summary = "node_failed", f"node {node.node_id} FAILED, needs a person: " \
                f"{node.reason}"
        elif lemon(node) and now - node.since < LEMON_ALERT_S:
            kind, summary = "lemon", f"node {node.node_id} is a lemon: {node.reason}"
        else:
            continue
        out.append(Alert(kind, node.node_id, summary, cluster_id=node.cluster_id,
                         node_id=node.node_id))
    return out


def domain_alerts(partitions: Iterable[Partition]) -> list[Alert]:
    """One alert per rack drained as one, or held by the guard per domain (from the
    partition's state, so a redelivered diagnosis never raises a second one)."""
    out = []
    for part in partitions:
        for rack, members in sorted(part.drained_domains.items()):
            out.append(Alert("rack_drained", f"{part.cluster_id}/{rack}",
                             f"rack {rack} ({part.name}) drained and repaired as one; "
                             f"{len(members)} node(s) not back yet: {', '.join(members)}",
                             cluster_id=part.cluster_id, details={"nodes": list(members)}))
        for rack in part.held_domains:
            out.append(Alert("rack_held", f"{part.cluster_id}/{rack}",
                             f"rack {rack} ({part.name}) should be drained as one, but the "
                             "guard per domain holds it (max_domains_out); repaired per node",
                             cluster_id=part.cluster_id))
    return out


def job_alerts(jobs: Iterable[Job], now: float, timeout_s: float, factor: float
               ) -> list[Alert]:
    out = []
    for job in jobs:
        stopping = job.interrupt_reason.startswith(progress.NO_PROGRESS) and not job.terminal
        if stopping or (job.state is JobState.RUNNING
                        and progress.stalled(job, now, timeout_s, factor)):
            reason = job.interrupt_reason if stopping else progress.no_progress_reason(
                job, now, timeout_s, factor)
            out.append(Alert("job_no_progress", job.job_id,
                             f"job {job.job_id} (attempt {job.attempt}): {reason}",
                             cluster_id=job.cluster_id, job_id=job.job_id))
        if job.recovery.storage_full and not job.terminal:
            out.append(Alert("job_storage_full", job.job_id,
                             f"job {job.job_id} interrupted: disk full at "
                             f"{job.recovery.storage_full}; it resumes from its checkpoint "
                             "when the file system has room", cluster_id=job.cluster_id,
                             job_id=job.job_id,
                             details={"path": job.recovery.storage_full,
                                      "since": job.recovery.storage_full_since}))
    return out


def rollout_alerts(rollouts: Iterable[dict[str, Any]], now: float) -> list[Alert]:
    """A rollout paused by a regression: while it rolls back and for a day after."""
    out = []
    for r in rollouts:
        if r.get("state") not in ("ROLLING_BACK", "ROLLED_BACK") or (
                r.get("ended") is not None and now - r["ended"] >= LEMON_ALERT_S):
            continue
        what = "rolled back" if r["state"] == "ROLLED_BACK" else "rolling back"
        version = ", ".join(f"{k} {v}" for k, v in sorted(r["version"].items()))
        out.append(Alert("rollout_rolled_back", r["id"],
                         f"cluster {r['cluster_id']}: rollout {r['id']} ({version}) regressed "
                         f"in wave {r.get('paused_wave')}, {what}: {r['reason']}",
                         cluster_id=r["cluster_id"], details={"rollout": r["id"]}))
    return out


def dead_letter_alert(count: int) -> Alert | None:
    if count <= 0:
        return None
    return Alert("dead_letters", "all", f"{count} dead-lettered event(s) wait for a person "
                 "(`mtc events`, the dead_letters collection)", details={"count": count})


def controller_alert(last_tick_at: float | None, now: float,
                     stale_s: float = CONTROLLER_STALE_S) -> Alert | None:
    """None while the controller ticks; None too before the first tick (nothing to run)."""
    if last_tick_at is None or now - last_tick_at <= stale_s:
        return None
    return Alert("controller_unreachable", "controller",
                 f"no fleet tick for {now - last_tick_at:.0f} s (limit {stale_s:.0f} s): "
                 "is `mtc serve` / `mtc controller` (or Cloud Scheduler's mtc-tick) running?",
                 details={"last_tick_at": last_tick_at})


def executor_alerts(docs: Iterable[dict[str, Any]], now: float,
                    stale_s: float = EXECUTOR_STALE_S) -> list[Alert]:
    """One alert per executor whose liveness document is older than ``stale_s`` (or than
    three of its own heartbeats, if those are longer). Nothing else follows from it."""
    out = []
    for doc in docs:
        seen = doc.get("last_seen")
        if seen is None:
            continue
        limit = max(stale_s, 3 * float(doc.get("heartbeat_s") or 0.0))
        age = now - float(seen)
        if age > limit:
            name = str(doc.get("executor_id") or doc.get("_id") or "?")
            out.append(Alert("executor_silent", name,
                             f"executor {name} silent for {age:.0f} s (limit {limit:.0f} s) "
                             f"on {doc.get('host', '?')}: compute requests wait for it; "
                             "is `python -m services.executor` running?",
                             details={"last_seen": float(seen), "host": doc.get("host", "")}))
    return out


# ---------------------------------------------------------------- deduplication


@dataclass
class Plan:
    """What one evaluation changes: documents to write or delete, notifications to send."""

    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    deletes: list[str] = field(default_factory=list)
    sends: list[dict[str, Any]] = field(default_factory=list)


def _doc(alert: Alert, now: float, first_at: float) -> dict[str, Any]:
    return {"kind": alert.kind, "subject": alert.subject, "summary": alert.summary,
            "severity": alert.severity, "cluster_id": alert.cluster_id,
            "node_id": alert.node_id, "job_id": alert.job_id, "details": dict(alert.details),
            "state": FIRING, "first_at": first_at, "last_sent_at": now, "sent": 1,
            "resolved_at": None, "expire_at": None}


def reconcile(active: Sequence[Alert], stored: Iterable[dict[str, Any]], now: float, *,
              reminder_s: float, retention_s: float, kinds: frozenset[str]) -> Plan:
    """Compare the alerts firing now with what the store remembers, for the ``kinds`` that
    were evaluated (``stored`` may hold others: they are left alone).

    A new alert (or one that had resolved) is written and sent; a firing one whose summary
    changed is sent again, as is one that reminds and was last sent ``reminder_s`` ago; one
    no longer firing is marked resolved and sent once; a resolved one is deleted
    ``retention_s`` after it resolved. Otherwise nothing is written: a tick that changes
    nothing writes nothing."""
    plan = Plan()
    by_id = {str(d["_id"]) if "_id" in d else alert_id(d["kind"], d["subject"]): d
             for d in stored if d.get("kind") in kinds}
    firing = {alert_id(a.kind, a.subject): a for a in active if a.kind in kinds}
    for doc_id, alert in firing.items():
        old = by_id.get(doc_id)
        if old is None or old.get("state") != FIRING:
            doc = _doc(alert, now, now)
        elif old.get("summary") != alert.summary or (
                KINDS[alert.kind].remind and now - float(old.get("last_sent_at") or 0.0)
                >= reminder_s):
            doc = {**_doc(alert, now, float(old.get("first_at") or now)),
                   "sent": int(old.get("sent") or 0) + 1}
        else:
            continue
        doc.pop("_id", None)
        plan.writes[doc_id] = doc
        plan.sends.append(doc)
    for doc_id, old in by_id.items():
        if doc_id in firing:
            continue
        if old.get("state") == FIRING:
            doc = {k: v for k, v in old.items() if k != "_id"}
            doc.update(state=RESOLVED, resolved_at=now, last_sent_at=now,
                       sent=int(old.get("sent") or 0) + 1, expire_at=now + retention_s)
            plan.writes[doc_id] = doc
            plan.sends.append(doc)
        elif old.get("resolved_at") is not None and now - float(old["resolved_at"]) >= retention_s:
            plan.deletes.append(doc_id)
    return plan


def cluster_kinds() -> frozenset[str]:
    return frozenset(k for k, v in KINDS.items() if v.scope == "cluster")


def global_kinds() -> frozenset[str]:
    return frozenset(k for k, v in KINDS.items() if v.scope == "global")


def listing(stored: Iterable[dict[str, Any]], now: float, last_tick_at: float | None,
            stale_s: float = CONTROLLER_STALE_S, *, include_resolved: bool = False,
            executors: Iterable[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """What ``/alerts.json`` answers: the stored alerts (firing ones, or all), plus the
    reader-evaluated controller and executor alerts, newest first."""
    out = [{k: v for k, v in d.items() if k != "_id"} for d in stored
           if include_resolved or d.get("state") == FIRING]
    controller = controller_alert(last_tick_at, now, stale_s)
    if controller is not None:
        out.append({**_doc(controller, now, last_tick_at or now), "sent": 0,
                    "last_sent_at": None})
    for silent in executor_alerts(executors, now):
        out.append({**_doc(silent, now, float(silent.details["last_seen"])), "sent": 0,
                    "last_sent_at": None})
    out.sort(key=lambda d: (-(d.get("first_at") or 0.0), d["kind"], d["subject"]))
    return out
