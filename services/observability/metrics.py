"""Prometheus metrics of the control plane, computed from the store at scrape time.

:class:`StoreCollector` is a ``prometheus_client`` custom collector: each scrape reads the
store (the nodes, jobs, outbox head, dead letters, tick records and alerts: one query each)
and folds the event log's new entries into the event-derived counters and histograms (an
:class:`EventStats` kept between scrapes: the first scrape reads the log from its start,
bounded by its retention, every later one only what is new). ``render`` gives the text
format ``/metrics`` answers. Names and labels are listed in the README (Observability).

Where there is no event log (Google Cloud keeps none), the event-derived families are
present and empty; the state gauges are the same everywhere.
"""

from __future__ import annotations

import bisect
import importlib.metadata
import math
import platform
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from services.observability import alerts
from shared.adapters.docstore import JOBS, NODES, PARTITIONS, DocEventLog, EventCursor
from shared.adapters.outbox import OUTBOX
from shared.adapters.outbox_bus import DEAD_LETTERS
from shared.domain.model import JobState, Node, NodeState
from shared.goodput import job_accounting
from shared.ports import Clock, DocStore, EventLog
from shared.service_layer import triage_policy

BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
MAX_JOB_SERIES = 200  # per-job series for this many jobs at most: bounded cardinality
RECENT_S = 3600.0  # an ended job keeps its series this long after it ended
PENDING_HORIZON_S = 24 * 3600.0  # a fault never followed by a drain is forgotten after this
_DRAIN_TYPES = ("mtc.node.draining.v1", "mtc.node.drained.v1", "mtc.node.repair_started.v1")
_GOODPUT_TYPES = frozenset({"mtc.job.submitted.v1", "mtc.job.requeued.v1", "mtc.job.started.v1",
                            "mtc.node.draining.v1", "mtc.job.interrupt_requested.v1",
                            "mtc.job.checkpoint_saved.v1", "mtc.job.workers_exited.v1",
                            "mtc.job.finished.v1"})


@dataclass
class Histogram:
    bounds: tuple[float, ...] = BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    def observe(self, value: float) -> None:
        value = max(0.0, value)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == math.inf else repr(bound), float(running)))
        return out


@dataclass
class EventStats:
    """What the event timeline says, accumulated incrementally (``feed``)."""

    repairs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (action, outcome)
    starts: Counter[str] = field(default_factory=Counter)  # action
    holds: Counter[str] = field(default_factory=Counter)  # action
    recoveries: Counter[str] = field(default_factory=Counter)  # by mode
    _requeue_chosen: set[str] = field(default_factory=set)  # jobs whose requeue was counted
    fault_to_drain: Histogram = field(default_factory=Histogram)
    fault_to_resumed: Histogram = field(default_factory=Histogram)
    _report_at: dict[str, float] = field(default_factory=dict)  # node -> first faulty report
    _fault_at: dict[str, float] = field(default_factory=dict)  # node -> observed fault time
    _resume_from: dict[str, float] = field(default_factory=dict)  # job -> fault time
    job_docs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    diagnosed: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=5000))

    def feed(self, docs: Iterable[dict[str, Any]]) -> None:
        for doc in docs:
            self._one(doc)

    def _one(self, doc: dict[str, Any]) -> None:
        data, t, type_ = doc.get("data") or {}, float(doc["time"]), doc["type"]
        node = data.get("node_id", "")
        if type_ == "mtc.node.health_reported.v1":
            faulty = [float(c.get("since") or t) for c in data.get("conditions") or ()
                      if c.get("status") == "true"]
            if faulty:  # first seen: the condition's since, or the report's observation
                self._report_at.setdefault(node, min([*faulty, float(data.get("observed_at", t))]))
            else:
                self._report_at.pop(node, None)
        elif type_ == "mtc.node.diagnosed.v1":
            self.diagnosed.append(doc)
            reported = self._report_at.pop(node, float(data.get("observed_at", t)))
            if data.get("action") != "none":  # a fault something is done about
                self._fault_at.setdefault(node, min(reported, float(data.get("observed_at", t))))
        elif type_ in _DRAIN_TYPES and node in self._fault_at:
            fault = self._fault_at.pop(node)
            self.fault_to_drain.observe(t - fault)
            if type_ == "mtc.node.draining.v1" and data.get("job_id"):
                self._resume_from.setdefault(data["job_id"], fault)
        elif type_ == "mtc.job.interrupt_requested.v1" and data.get("node_id") in self._fault_at:
            self._resume_from.setdefault(data["job_id"], self._fault_at.pop(data["node_id"]))
        elif type_ == "mtc.node.repair_held.v1":
            self._fault_at.pop(node, None)
            self.holds[data.get("action", "")] += 1
        elif type_ == "mtc.job.started.v1" and data.get("job_id") in self._resume_from:
            self.fault_to_resumed.observe(t - self._resume_from.pop(data["job_id"]))
        if type_ == "mtc.node.repair_started.v1":
            self.starts[data.get("action", "")] += 1
        elif type_ == "mtc.node.repair_completed.v1":
            self.repairs[(data.get("action", ""), "succeeded" if data.get("ok") else "failed")] += 1
        elif type_ == "mtc.node.retired.v1" and data.get("replacement_id"):
            self.repairs[("replace", "succeeded")] += 1
        self._recovery(type_, data)
        if type_ in _GOODPUT_TYPES and data.get("job_id"):
            self.job_docs.setdefault(data["job_id"], []).append(doc)
        horizon = t - PENDING_HORIZON_S
        if len(self._fault_at) + len(self._report_at) > 10_000:
            self._fault_at = {n: f for n, f in self._fault_at.items() if f >= horizon}
            self._report_at = {n: f for n, f in self._report_at.items() if f >= horizon}

    def _recovery(self, type_: str, data: dict[str, Any]) -> None:
        """Recoveries by mode: each ``JobRecoveryChosen``, and each requeue no choice
        preceded (the plain requeue: the policy had no alternative) as ``requeue``."""
        job = str(data.get("job_id", ""))
        if type_ == "mtc.job.recovery_chosen.v1":
            mode = str(data.get("mode", ""))
            self.recoveries[mode] += 1
            if mode == "requeue":
                self._requeue_chosen.add(job)
        elif type_ == "mtc.job.requeued.v1":
            if job in self._requeue_chosen:
                self._requeue_chosen.discard(job)
            else:
                self.recoveries["requeue"] += 1

    def accounting(self, job_id: str) -> Any:
        return job_accounting([*self.diagnosed, *self.job_docs.get(job_id, [])], job_id)


# ---------------------------------------------------------------- gauges from state


def node_gauges(docs: Iterable[dict[str, Any]]) -> dict[str, Counter[tuple[str, ...]]]:
    """Nodes by (cluster, partition, state), held repairs and lemons by (cluster, partition):
    pure over the node documents."""
    states: Counter[tuple[str, ...]] = Counter()
    held: Counter[tuple[str, ...]] = Counter()
    lemons: Counter[tuple[str, ...]] = Counter()
    for doc in docs:
        where = (doc["cluster_id"], doc.get("partition", ""))
        states[(*where, doc["state"])] += 1
        if doc["state"] in (NodeState.SUSPECT.value, NodeState.RETIRED.value):
            node = Node.from_dict(doc)
            held[where] += alerts.held(node)
            lemons[where] += alerts.lemon(node)
    return {"states": states, "held": held, "lemons": lemons}


def per_job_series(docs: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The jobs that get series of their own: live ones, and those ended in the last
    ``RECENT_S`` (a dashboard sees how they ended), newest first, at most ``MAX_JOB_SERIES``:
    every job ever submitted keeping its own series is unbounded cardinality."""
    kept = [d for d in docs if d.get("ended_at") is None
            or float(d["ended_at"]) >= now - RECENT_S]
    kept.sort(key=lambda d: -float(d.get("created_at") or 0.0))
    return kept[:MAX_JOB_SERIES]


def last_tick(docs: Iterable[dict[str, Any]]) -> float | None:
    return max((float(d["at"]) for d in docs if d.get("at") is not None), default=None)


class StoreCollector:
    """The custom collector: register it in a ``CollectorRegistry`` (``registry()``)."""

    def __init__(self, store: DocStore, clock: Clock, *, event_log: EventLog | None = None,
                 clusters: Mapping[str, str] | None = None) -> None:
        """``clusters``: the only clusters a scrape may see (one project's), each domain id
        with the id its project knows it by (services.api.ids), which its series are
        labelled with; None: the fleet, labelled with the domain's ids.
        A scoped scrape gets its clusters' node and job series and the controller's
        liveness, none of the fleet-wide ones (outbox, dead letters, executors, the event
        log's repairs and histograms), which would tell one tenant about the others."""
        self.store = store
        self.clock = clock
        self.clusters = clusters
        self.stats = EventStats()
        self._cursor = (EventCursor(event_log) if isinstance(event_log, DocEventLog)
                        and clusters is None else None)

    def _mine(self, docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.clusters is None:
            return list(docs)
        names = self.clusters
        return [{**d, "cluster_id": names[d["cluster_id"]]} for d in docs
                if d.get("cluster_id") in names]

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time; no collection at registration

    def collect(self) -> Iterator[Metric]:
        now = self.clock.now()
        if self._cursor is not None:
            self.stats.feed(self._cursor.next())
        yield from self._nodes()
        yield from self._jobs()
        yield from self._triage_shadow()
        if self.clusters is not None:
            yield from self._liveness(now)
            return
        yield from self._bus(now)
        yield from self._events()

    def _nodes(self) -> Iterator[Metric]:
        g = node_gauges(self._mine(self.store.read(NODES, {})))
        nodes = GaugeMetricFamily("mtc_nodes", "Nodes by cluster, partition and state",
                                  labels=["cluster", "partition", "state"])
        places = sorted({labels[:2] for labels in g["states"]})
        for where in places:  # every state, 0 included: a rule sees a state empty out
            for state in NodeState:
                nodes.add_metric([*where, state.value], g["states"].get((*where, state.value), 0))
        yield nodes
        for name, key, text in (("mtc_repairs_held", "held", "Repairs held by the blast-radius "
                                 "guard (SUSPECT nodes kept in service)"),
                                ("mtc_lemons", "lemons", "Nodes retired as lemons (still on record)")):
            family = GaugeMetricFamily(name, text, labels=["cluster", "partition"])
            for labels, n in sorted(g[key].items()):
                family.add_metric(list(labels), n)
            yield family
        racks = GaugeMetricFamily("mtc_racks_drained", "Racks drained to be repaired as one "
                                  "(docs/racks.md), and racks the guard per domain holds",
                                  labels=["cluster", "partition", "state"])
        for doc in self._mine(self.store.read(PARTITIONS, {})):
            place = [str(doc["cluster_id"]), str(doc["name"])]
            racks.add_metric([*place, "drained"], len(doc.get("drained_domains") or {}))
            racks.add_metric([*place, "held"], len(doc.get("held_domains") or ()))
        yield racks

    def _jobs(self) -> Iterator[Metric]:
        docs = self._mine(self.store.read(JOBS, {}))
        by_state: Counter[tuple[str, str]] = Counter((d["cluster_id"], d["state"]) for d in docs)
        jobs = GaugeMetricFamily("mtc_jobs", "Jobs by cluster and state",
                                 labels=["cluster", "state"])
        for cluster in sorted({c for c, _ in by_state}):
            for state in JobState:
                jobs.add_metric([cluster, state.value], by_state.get((cluster, state.value), 0))
        yield jobs
        newest = per_job_series(docs, self.clock.now())
        restarts = CounterMetricFamily("mtc_job_restarts", "Restarts of each live (or lately "
                                       "ended) job so far", labels=["cluster", "job"])
        goodput = GaugeMetricFamily("mtc_job_goodput_ratio", "Runtime goodput of each job "
                                    "(productive / wall time, from its event timeline)",
                                    labels=["cluster", "job"])
        recovery = GaugeMetricFamily("mtc_job_recovery_seconds", "Time each job spent "
                                     "recovering from interruptions", labels=["cluster", "job"])
        lost = GaugeMetricFamily("mtc_job_lost_steps", "Steps each job recomputed after "
                                 "resuming", labels=["cluster", "job"])
        for d in newest:
            ids: list[str] = [d["cluster_id"], d["job_id"]]
            restarts.add_metric(ids, d.get("restart_count", 0))
            if self._cursor is None or d["job_id"] not in self.stats.job_docs:
                continue
            acct = self.stats.accounting(d["job_id"])
            if acct.wall_s > 0:
                goodput.add_metric(ids, acct.runtime_goodput)
                recovery.add_metric(ids, acct.recovery_s)
                lost.add_metric(ids, acct.lost_steps)
        yield from (restarts, goodput, recovery, lost)

    def _triage_shadow(self) -> Iterator[Metric]:
        """A candidate triage table's diff report (bounded rows per cluster) and its
        recommendations waiting for an operator."""
        diff = GaugeMetricFamily(
            "mtc_triage_shadow_differences", "Reports a candidate triage table would decide "
            "differently, by cause and by what each table does",
            labels=["cluster", "cause", "active_action", "candidate_action"])
        evaluated = GaugeMetricFamily("mtc_triage_shadow_evaluated", "Reports with a finding "
                                      "triaged under both tables", labels=["cluster"])
        repair = GaugeMetricFamily(
            "mtc_repair_shadow_differences", "Diagnoses a candidate repair configuration "
            "would act on differently, by cause and by each one's step (kind and action)",
            labels=["cluster", "cause", "active_step", "candidate_step"])
        for doc in self._mine(self.store.read(triage_policy.SHADOW, {})):
            cluster = str(doc["cluster_id"])
            triage = doc.get(triage_policy.TRIAGE_REPORT) or {}
            evaluated.add_metric([cluster], float(triage.get("evaluated", 0)))
            for row in triage.get("rows", ()):
                diff.add_metric([cluster, str(row["cause"]), str(row["active"]["action"]),
                                 str(row["candidate"]["action"])], float(row["count"]))
            for row in (doc.get(triage_policy.REPAIR_REPORT) or {}).get("rows", ()):
                repair.add_metric([cluster, str(row["cause"]), _step(row["active"]),
                                   _step(row["candidate"])], float(row["count"]))
        pending = GaugeMetricFamily("mtc_triage_recommendations_pending", "A candidate's "
                                    "recommendations waiting for an operator",
                                    labels=["cluster"])
        waiting = Counter(d["cluster_id"] for d in self._mine(self.store.read(
            triage_policy.RECOMMENDATIONS, {"verdict": "pending"})))
        for cluster, count in sorted(waiting.items()):
            pending.add_metric([cluster], count)
        yield from (diff, evaluated, repair, pending)

    def _bus(self, now: float) -> Iterator[Metric]:
        head = self.store.oldest(OUTBOX, 1)
        lag = GaugeMetricFamily("mtc_bus_lag_seconds", "Age of the oldest undelivered outbox "
                                "entry (0: the outbox is empty)")
        lag.add_metric([], max(0.0, now - float(head[0]["time"])) if head else 0.0)
        yield lag
        dead = GaugeMetricFamily("mtc_dead_letters", "Dead-lettered events on record")
        dead.add_metric([], len(self.store.read(DEAD_LETTERS, {})))
        yield dead
        yield from self._liveness(now)
        executors = self.store.read(alerts.EXECUTORS, {})
        seen = GaugeMetricFamily("mtc_executor_last_seen_age_seconds", "Seconds since each "
                                 "compute executor last recorded that it is alive",
                                 labels=["executor"])
        for doc in executors:
            if doc.get("last_seen") is not None:
                seen.add_metric([str(doc.get("executor_id", ""))],
                                max(0.0, now - float(doc["last_seen"])))
        yield seen
        firing = Counter(d["kind"] for d in self.store.read(alerts.ALERTS, {"state": alerts.FIRING}))
        controller = alerts.controller_alert(
            last_tick(self.store.read(alerts.CONTROLLER_TICKS, {})), now)
        if controller is not None:
            firing[controller.kind] += 1
        for silent in alerts.executor_alerts(executors, now):
            firing[silent.kind] += 1
        active = GaugeMetricFamily("mtc_alerts_firing", "Alerts firing, by kind",
                                   labels=["kind"])
        for kind in alerts.KINDS:
            active.add_metric([kind], firing.get(kind, 0))
        yield active

    def _liveness(self, now: float) -> Iterator[Metric]:
        tick = last_tick(self.store.read(alerts.CONTROLLER_TICKS, {}))
        age = GaugeMetricFamily("mtc_controller_last_tick_age_seconds", "Seconds since the "
                                "controller last ticked the fleet (absent before the first)")
        stamp = GaugeMetricFamily("mtc_controller_last_tick_timestamp_seconds", "When the "
                                  "controller last ticked the fleet (Unix time)")
        if tick is not None:
            age.add_metric([], max(0.0, now - tick))
            stamp.add_metric([], tick)
        yield age
        yield stamp

    def _events(self) -> Iterator[Metric]:
        s = self.stats
        repairs = CounterMetricFamily("mtc_repairs", "Repairs completed, by action and "
                                      "outcome (succeeded, failed), from the event log",
                                      labels=["action", "outcome"])
        for (action, outcome), n in sorted(s.repairs.items()):
            repairs.add_metric([action, outcome], n)
        yield repairs
        for name, counts, text in (
                ("mtc_repair_starts", s.starts, "Repairs started, by action"),
                ("mtc_repair_holds", s.holds, "Repairs the blast-radius guard held, by action")):
            counter = CounterMetricFamily(name, text, labels=["action"])
            for action, n in sorted(counts.items()):
                counter.add_metric([action], n)
            yield counter
        recoveries = CounterMetricFamily("mtc_recoveries", "Job recoveries by mode (in_place, "
                                         "hot_swap, scale_down, requeue), from the event log",
                                         labels=["mode"])
        for mode, n in sorted(s.recoveries.items()):
            recoveries.add_metric([mode], n)
        yield recoveries
        for name, hist, text in (
                ("mtc_fault_to_drain_seconds", s.fault_to_drain,
                 "From a fault's observed time to the node being taken out (drain or repair)"),
                ("mtc_fault_to_resumed_seconds", s.fault_to_resumed,
                 "From a fault's observed time to its job's next attempt starting")):
            family = HistogramMetricFamily(name, text)
            family.add_metric([], hist.buckets(), sum_value=hist.total)
            yield family


def _step(decision: Mapping[str, Any]) -> str:
    """A repair step's label: its kind, and its action where it has one (``hold reboot``)."""
    kind, action = str(decision["step"]), str(decision["action"])
    return kind if action == "none" else f"{kind} {action}"


def registry(store: DocStore, clock: Clock, *, event_log: EventLog | None = None,
             clusters: Mapping[str, str] | None = None) -> CollectorRegistry:
    """A registry of its own holding one StoreCollector (never the global default one)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(store, clock, event_log=event_log, clusters=clusters))
    if clusters is None:  # the serving process itself: a fleet view, not a tenant's
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        info = Info("mtc_build", "The mtc build serving this endpoint", registry=reg)
        info.info({"version": _version(), "python": platform.python_version()})
    return reg


def _version() -> str:
    try:
        return importlib.metadata.version("mtc")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
