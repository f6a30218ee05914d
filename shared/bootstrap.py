"""The only place that picks implementations: adapters are wired to handlers here.

``embedded`` is the default (sqlite store, outbox bus, local subprocess compute): every CLI
process builds the same app over the same state directory. Tests and the simulator build
their own variants through ``build_deps``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shared.adapters.docstore import DocEventLog, DocStore, DocUnitOfWork, make_envelope
from shared.adapters.outbox_bus import DocDeadLetters, OutboxBus
from shared.config import ControlPlaneConfig
from shared.domain.events import Envelope, Event, FleetTicked
from shared.handling import Deps
from shared.ports import Clock, Compute, Publisher

log = logging.getLogger("mtc.bootstrap")


class SystemClock:
    def now(self) -> float:
        return time.time()


def build_deps(store: DocStore, *, clock: Clock, compute: Compute, publisher: Publisher,
               config: ControlPlaneConfig | None = None, source: str = "//mtc/control-plane",
               with_event_log: bool = True, outbox: Any = None) -> Deps:
    return Deps(
        uow=lambda: DocUnitOfWork(store, source=source, clock=clock.now),
        clock=clock,
        compute=compute,
        publisher=publisher,
        config=config or ControlPlaneConfig(),
        dead_letters=DocDeadLetters(store),
        event_log=DocEventLog(store) if with_event_log else None,
        outbox=outbox,
    )


@dataclass
class EmbeddedApp:
    """The whole control plane in one process, over a state directory on this machine."""

    state_dir: Path
    store: DocStore
    bus: OutboxBus
    compute: Any  # LocalCompute: also has poll() and inject_fault()
    deps: Deps

    def uow(self) -> DocUnitOfWork:
        return self.deps.uow()  # type: ignore[no-any-return]

    @contextmanager
    def transaction(self) -> Iterator[DocUnitOfWork]:
        """An API call: validate and write in one transaction, then deliver what it emitted."""
        uow = self.uow()
        with uow:
            uow.caused_by("")
            yield uow
            uow.commit()

    def inject(self, event: Event, source: str) -> Envelope:
        env = make_envelope(event, source, self.deps.clock.now())
        self.bus.inject(env)
        return env

    def pump(self) -> int:
        """Deliver everything queued, polling compute for results, until nothing moves."""
        total = 0
        while True:
            self.compute.poll()
            moved = self.bus.pump(self.deps)
            total += moved
            if moved == 0:
                return total

    def tick(self) -> None:
        from shared.adapters.docstore import CLUSTERS

        now = self.deps.clock.now()
        for doc in self.store.read(CLUSTERS, {}):
            if doc["state"] not in ("DELETED",):
                self.inject(FleetTicked(cluster_id=doc["cluster_id"], at=now), "//mtc/scheduler")

    def run(self, until: Callable[[], bool], *, timeout_s: float, poll_s: float = 0.1,
            tick_s: float = 5.0) -> bool:
        """Pump until ``until()`` holds or the timeout passes; ticks keep heartbeats honest."""
        deadline = time.monotonic() + timeout_s
        next_tick = time.monotonic() + tick_s
        while time.monotonic() < deadline:
            self.pump()
            if until():
                return True
            if time.monotonic() >= next_tick:
                self.tick()
                next_tick = time.monotonic() + tick_s
            time.sleep(poll_s)
        return False

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close:
            close()


def embedded(state_dir: Path, *, config: ControlPlaneConfig | None = None,
             clock: Clock | None = None, compute_options: dict[str, Any] | None = None
             ) -> EmbeddedApp:
    from shared.adapters.local_compute import LocalCompute
    from shared.adapters.sqlite_store import SqliteDocStore

    state_dir = state_dir.resolve()
    clock = clock or SystemClock()
    config = config or ControlPlaneConfig()
    if config.output_root == ControlPlaneConfig().output_root:
        config = replace(config, output_root=state_dir / "jobs", python=sys.executable)
    store = SqliteDocStore(state_dir / "mtc.db")
    bus = OutboxBus(store)

    def emit(event: Event) -> None:
        bus.inject(make_envelope(event, "//mtc/compute/local", clock.now()))

    compute = LocalCompute(state_dir / "compute", emit, clock, **(compute_options or {}))
    deps = build_deps(store, clock=clock, compute=compute, publisher=bus, config=config)
    return EmbeddedApp(state_dir, store, bus, compute, deps)
