"""The simulated bus: the Publisher port on SimPy time.

:class:`SimBus` delivers every envelope to the subscribers its routes name, through the real
``run_handler`` (idempotency, staleness, outbox) after a sampled latency, and can duplicate and
reorder deliveries; a handler that raises is redelivered later, as Pub/Sub would. It keeps the
event log (``rows``) the goodput accounting reads, and per-service handler time.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from shared.domain.errors import PermanentError
from shared.domain.events import Envelope, Event
from shared.handling import Deps, Outcome, Routes, run_handler
from simulator.clock import SimClock, call_later
from simulator.scenario_types import BusCfg

log = logging.getLogger("mtc.sim")


@dataclass
class BusStats:
    published: int = 0
    delivered: int = 0
    duplicates: int = 0
    reordered: int = 0
    retries: int = 0
    gave_up: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    handler_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_type: dict[str, int] = field(default_factory=lambda: defaultdict(int))


Listener = Callable[[Envelope], None]
PRUNE_EVERY = 4096  # deliveries between two looks at the oldest ids in ``SimBus._seen``


class SimBus:
    """The Publisher port: latency, duplication, reordering, redelivery of failed handlers."""

    def __init__(self, env: simpy.Environment, cfg: BusCfg, rng: np.random.Generator,
                 clock: SimClock, routes: Routes, *, record: bool = False) -> None:
        self.env = env
        self.routes = routes
        self.cfg = cfg
        self.rng = rng
        self.clock = clock
        self.deps: Deps | None = None
        self._listeners_of: dict[str, list[Listener]] = {}  # event type -> who is told
        self.rows: list[dict[str, Any]] = []  # the event log: type, time, data (+ id, source)
        self.stats = BusStats()
        # (time, envelope, services, api call): what was delivered, for replays (bench)
        self.record: list[tuple[float, Envelope | None, tuple[str, ...] | None, Any]] | None = (
            [] if record else None)
        # ids already logged, in delivery order, with the delivery time: a duplicate is
        # logged once; ids older than the idempotency window are forgotten (as the handlers
        # forget theirs), so the set does not grow with the run
        self._seen: dict[str, float] = {}
        self._seen_window_s = math.inf
        self._next_prune = PRUNE_EVERY
        self._ids = itertools.count(1)
        self.errors: dict[str, int] = defaultdict(int)  # handler exceptions, by message
        self._fixed_latency = cfg.latency.kind == "fixed"
        # the latencies a block at a time while nothing else draws from the bus's stream
        # (no reordering, no duplicates): the same numbers as a draw per event
        self._latencies = (cfg.latency.draws(rng) if not (cfg.reorder or cfg.duplicate)
                           and not self._fixed_latency else None)
        # what else forgets by the same window when the bus does (the twin: the store's
        # idempotency records, which the embedded control plane's sweeper prunes)
        self.on_prune: Callable[[float], None] | None = None

    def publish(self, envelope: Envelope) -> None:
        self.stats.published += 1
        cfg = self.cfg
        if self._latencies is not None:
            delay = next(self._latencies)
        else:
            delay = cfg.latency.a if self._fixed_latency else cfg.latency.sample(self.rng)
        if cfg.reorder and self.rng.random() < cfg.reorder:
            delay += cfg.reorder_delay.sample(self.rng)
            self.stats.reordered += 1
        call_later(self.env, delay, self._deliver, envelope, None, 1)
        if cfg.duplicate and self.rng.random() < cfg.duplicate:
            self.stats.duplicates += 1
            call_later(self.env, delay + cfg.latency.sample(self.rng), self._deliver, envelope,
                       None, 1)

    def listen(self, listener: Listener, *events: type[Event]) -> None:
        """Tell ``listener`` of each logged event of these types (and of no other: a
        listener called for every delivery, to look at its type, cost a call per event)."""
        for kind in events:
            self._listeners_of.setdefault(kind.TYPE, []).append(listener)

    def emit(self, event: Event, source: str) -> Envelope:
        """Publish an event from outside any transaction (compute, agents, operators)."""
        # the id from a counter, not uuid4: unique within the run, and cheaper (one per
        # agent report); nothing reads more into it than uniqueness
        envelope = Envelope(event=event, id=f"sim-{next(self._ids):x}", source=source,
                            time=self.clock.now())
        self.publish(envelope)
        return envelope

    def _deliver(self, envelope: Envelope, services: tuple[str, ...] | None, n: int) -> None:
        deps = self.deps
        assert deps is not None, "SimBus.deps must be set before the simulation runs"
        at = self.env.now  # one read of the clock per delivery (every name below is local)
        etype = envelope.event.TYPE
        if self.record is not None:
            self.record.append((float(at), envelope, services, None))
        stats = self.stats
        handler_s, outcomes = stats.handler_s, stats.outcomes
        failed: list[str] = []
        clock = time.perf_counter
        for service, handler in self.routes.subscribers(etype):
            if services is not None and service not in services:
                continue
            t0 = clock()
            try:
                outcome = run_handler(service, handler, envelope, deps)
            except PermanentError:  # pragma: no cover - run_handler dead-letters these
                outcome = Outcome.DEAD_LETTERED
            except Exception as exc:  # transient: Pub/Sub redelivers to this subscription
                failed.append(service)
                outcome = None
                self.errors[f"{service}: {type(exc).__name__}: {exc}"[:200]] += 1
            handler_s[service] += clock() - t0
            if outcome is not None:
                outcomes[outcome._value_] += 1
        if failed:
            if n < self.cfg.max_deliveries:
                stats.retries += 1
                call_later(self.env, self.cfg.retry_delay_s * 2 ** (n - 1), self._deliver,
                           envelope, tuple(failed), n + 1)
            else:
                stats.gave_up += 1
                log.warning("gave up delivering %s to %s after %d attempts", etype,
                            ",".join(failed), n)
        seen = self._seen
        if services is not None or envelope.id in seen:
            return
        now = self.clock.epoch_s + float(at)
        seen[envelope.id] = now
        if len(seen) >= self._next_prune:
            self._prune_seen(now)
        stats.delivered += 1
        stats.by_type[etype] += 1
        self.rows.append({"type": etype, "time": envelope.time,
                          "data": envelope.event.to_dict(), "id": envelope.id,
                          "source": envelope.source, "delivered_at": now})
        for listener in self._listeners_of.get(etype, ()):
            listener(envelope)

    def _prune_seen(self, now: float) -> None:
        """Forget the ids logged longer ago than the idempotency window (oldest first)."""
        if self._seen_window_s == math.inf and self.deps is not None:
            self._seen_window_s = self.deps.config.idempotency_window_s
        cutoff = now - self._seen_window_s
        seen = self._seen
        stale = []
        for key, at in seen.items():
            if at >= cutoff:
                break
            stale.append(key)
        for key in stale:
            del seen[key]
        self._next_prune = len(seen) + PRUNE_EVERY
        if self.on_prune is not None:
            self.on_prune(now)
