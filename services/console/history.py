"""The console's charts over time, from a bounded history it stores itself.

Every ``interval_s`` a thread of ``mtc serve`` (``Sampler``; never the control loop's, so a
slow read cannot hold up healing) asks ``History.sample_if_due`` for one sample per live
cluster: nodes per sinfo word (zeros included), the runtime goodput of its running jobs, the
repairs the blast-radius guard holds, and each fault-to-drain (a node's diagnosis to its
drained event) that ended since the previous sample. Samples live in the ``console_history``
collection of the state store for ``retention_s`` (default a day: 8,640 small documents per
cluster at 10 s) and ``prune`` drops older ones; a read is cut to ``MAX_POINTS`` points, so
neither the store nor an answer grows with time. ``snapshot`` and ``series`` are pure.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.console.accounting import accounting
from services.console.views import SINFO, WORDS, workers
from services.observability.alerts import held
from shared.adapters.docstore import CLUSTERS
from shared.domain.health import RepairAction
from shared.domain.model import Job, JobState, Node
from shared.ports import DocStore, Pruning, RangeReads

log = logging.getLogger("mtc.console")
HISTORY = "console_history"
PRUNE_S = 600.0
INTERVAL_S = 10.0
RETENTION_S = 24 * 3600.0
MAX_POINTS = 240  # points per series in one answer, whatever the window
T_DIAGNOSED, T_DRAINED = "mtc.node.diagnosed.v1", "mtc.node.drained.v1"
LOOKBACK_S = 3600.0  # a drain's diagnosis is looked for this far back
TAKES_OUT = frozenset(a.value for a in RepairAction if a.takes_node_out)


def fault_to_drain(docs: Sequence[Mapping[str, Any]], since: float, until: float,
                   node_ids: set[str]) -> list[float]:
    """Seconds from each node's latest diagnosis to its drained event, for the drains in
    ``[since, until)``; a drain with no diagnosis before it (an operator's) is left out."""
    fault_at: dict[str, float] = {}
    out = []
    for doc in docs:
        data = doc.get("data") or {}
        node = data.get("node_id")
        if node not in node_ids:
            continue
        if doc["type"] == T_DIAGNOSED and data.get("action") in TAKES_OUT:
            fault_at.setdefault(node, float(data.get("observed_at", doc["time"])))
        elif doc["type"] == T_DRAINED and node in fault_at:
            at = float(doc["time"])
            if since <= at < until:
                out.append(round(max(0.0, at - fault_at[node]), 2))
            del fault_at[node]
    return out


def snapshot(cluster_id: str, nodes: Iterable[Node], jobs: Sequence[Job],
             docs: Sequence[Mapping[str, Any]], since: float, now: float) -> dict[str, Any]:
    """One sample of a cluster at ``now`` (``docs``: the event log from before ``since``)."""
    mine = workers(nodes)
    counts = dict.fromkeys(WORDS, 0)
    for n in mine:
        counts[SINFO[n.state]] = counts.get(SINFO[n.state], 0) + 1
    running = [j for j in jobs if j.state is JobState.RUNNING and j.started_at is not None]
    productive = wall = 0.0
    for acct, _ in accounting(docs, running, now).values():
        productive += acct.productive_s
        wall += acct.wall_s
    return {"cluster": cluster_id, "time": now, "nodes": counts,
            "held": sum(1 for n in mine if held(n)),
            "goodput": round(100.0 * productive / wall, 1) if wall > 0 else None,
            "faultToDrainS": fault_to_drain(docs, since, now, {n.node_id for n in mine})}


def series(samples: Sequence[Mapping[str, Any]], points: int = MAX_POINTS) -> dict[str, Any]:
    """The samples (oldest first) as chart series of at most ``points`` points: every k-th
    sample, the newest always kept; fault-to-drain keeps every value in the window (the
    slowest first when there are more than ``points``)."""
    step = max(1, -(-len(samples) // points))
    picked = list(samples[::-1][::step])[::-1]
    drains = [(float(s["time"]), d) for s in samples for d in s.get("faultToDrainS", ())]
    if len(drains) > points:
        drains = sorted(sorted(drains, key=lambda p: -p[1])[:points])
    return {"times": [float(s["time"]) for s in picked],
            "nodes": {w: [int(s["nodes"].get(w, 0)) for s in picked] for w in WORDS},
            "held": [int(s.get("held", 0)) for s in picked],
            "goodput": [s.get("goodput") for s in picked],
            "faultToDrain": [{"time": t, "seconds": d} for t, d in drains],
            "samples": len(samples)}


class History:
    """The samples in the state store: written by the control loop, read by the console."""

    def __init__(self, store: DocStore, *, interval_s: float = INTERVAL_S,
                 retention_s: float = RETENTION_S) -> None:
        if interval_s <= 0 or retention_s <= interval_s:
            raise ValueError("need 0 < interval_s < retention_s")
        self.store = store
        self.interval_s = interval_s
        self.retention_s = retention_s
        self._last: float | None = None
        self._seq = itertools.count()

    def sample_if_due(self, uow_factory: Any, event_log: Any, now: float) -> int:
        """A sample of every live cluster when ``interval_s`` has passed; returns how many."""
        if self._last is not None and now - self._last < self.interval_s:
            return 0
        since, self._last = (self._last if self._last is not None else now), now
        live = [d["cluster_id"] for d in self.store.read(CLUSTERS, {})
                if d.get("state") != "DELETED"]
        with uow_factory() as uow:  # written after it: a read's rollback would drop them
            fleet = [(cid, uow.nodes.list(cid), uow.jobs.list(cid)) for cid in live]
        # a running job's goodput counts from its start: its events are read from there
        start = min([now - LOOKBACK_S, *(j.created_at for _, _, jobs in fleet for j in jobs
                                          if j.state is JobState.RUNNING)])
        docs = list(event_log.read(start)) if event_log is not None else []
        samples = [snapshot(cid, nodes, jobs, docs, since, now) for cid, nodes, jobs in fleet]
        for sample in samples:
            self.write(sample)
        return len(samples)

    def write(self, sample: dict[str, Any]) -> None:
        doc = {**sample, "seq": next(self._seq), "expire_at": sample["time"] + self.retention_s,
               "id": f"{sample['time']:.6f}-{sample['cluster']}"}
        self.store.write(HISTORY, doc["id"], doc)

    def read(self, cluster_id: str, since: float) -> list[dict[str, Any]]:
        """The cluster's samples from ``since``, oldest first."""
        if isinstance(self.store, RangeReads):
            docs = self.store.since(HISTORY, since)
        else:
            docs = sorted((d for d in self.store.read(HISTORY, {}) if d["time"] >= since),
                          key=lambda d: (d["time"], d.get("seq", 0)))
        return [d for d in docs if d.get("cluster") == cluster_id]

    def prune(self, now: float, limit: int = 20_000) -> int:
        """Delete up to ``limit`` samples older than the retention; returns how many."""
        if isinstance(self.store, Pruning):
            return int(self.store.prune(HISTORY, now - self.retention_s, limit))
        old = sorted((d for d in self.store.read(HISTORY, {}) if d["expire_at"] < now),
                     key=lambda d: d["expire_at"])[:limit]
        for d in old:
            self.store.remove(HISTORY, d["id"])
        return len(old)


class Sampler:
    """Samples every ``interval_s`` and prunes every ``PRUNE_S`` on a daemon thread of its
    own; a pass that fails is logged and the next one runs (a chart is not worth a crash)."""

    def __init__(self, history: History, uow_factory: Any, event_log: Any, clock: Any) -> None:
        self.history = history
        self.uow_factory = uow_factory
        self.event_log = event_log
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        now = self.clock.now()
        self.history.sample_if_due(self.uow_factory, self.event_log, now)

    def _run(self) -> None:
        next_prune = 0.0
        while not self._stop.is_set():
            try:
                self.step()
                if self.clock.now() >= next_prune:
                    self.history.prune(self.clock.now())
                    next_prune = self.clock.now() + PRUNE_S
            except Exception:
                log.exception("console history sample failed")
            self._stop.wait(self.history.interval_s)

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="mtc-console-history",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
