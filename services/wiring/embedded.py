"""The whole control plane in one process, over a state directory on this machine.

``embedded(state_dir)`` is the default (sqlite store, outbox bus, local subprocess compute):
every CLI process builds the same app over the same state directory, so commands work across
processes. ``embedded(state_dir, compute="slurm", slurm_conf=...)`` is the same control plane
driving a real Slurm cluster. Both are built by ``builder.build_deps``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from services.observability.alert_sinks import webhook_from_env
from services.wiring import job_credentials
from services.wiring.builder import ComputeKind, build_deps, local_config, make_compute
from services.wiring.routes import control_plane_routes
from shared.adapters import state_files
from shared.adapters.advice_file import FileAdviceSink
from shared.adapters.docstore import CLUSTERS, DocUnitOfWork
from shared.adapters.outbox import make_envelope
from shared.adapters.outbox_bus import OutboxBus
from shared.adapters.private_files import private_dir
from shared.config import ControlPlaneConfig
from shared.domain.events import Envelope, Event, FleetTicked
from shared.handling import Deps, command_unit, run_command
from shared.ports import Clock, Closeable, DocStore

log = logging.getLogger("mtc.embedded")
T = TypeVar("T")


@dataclass
class EmbeddedApp:
    """The control plane over one state directory: commands in, the bus pumped."""

    state_dir: Path
    store: DocStore
    bus: OutboxBus
    compute: Any  # LocalCompute or SlurmCompute: also has poll() and inject_fault()
    deps: Deps
    slurm_conf: str | None = None  # over Slurm: the cluster's (its slurmrestd tokens too)

    def uow(self) -> DocUnitOfWork:
        return cast(DocUnitOfWork, self.deps.uow())  # (build_deps: document units of work)

    def command(self, fn: Callable[[Any], T], *, key: str = "") -> T:
        """An API or CLI call: one transaction (``run_command``); the bus delivers its events."""
        return run_command(self.deps, fn, key=key)

    def transaction(self) -> AbstractContextManager[DocUnitOfWork]:
        """``command`` as a ``with`` block, for scripts that read and write in one go."""
        return command_unit(self.deps)

    def inject(self, event: Event, source: str) -> Envelope:
        env = make_envelope(event, source, self.deps.clock.now())
        self.bus.inject(env)
        return env

    def pump(self, *, budget_s: float = 5.0, max_polls: int | None = None) -> int:
        """Deliver everything queued, polling compute for results, until nothing moves, or
        for about ``budget_s`` of wall time. After each poll the queue gets up to
        ``budget_s`` of delivery before compute is polled again: a large fleet's agents
        report faster than one process delivers, and a poll of 16k simulated nodes takes
        seconds by itself, so "until nothing moves" alone would never return. ``max_polls``
        returns after that many poll-and-deliver rounds (``run`` looks at its condition
        after each)."""
        total = 0
        polls = 0
        start = time.monotonic()
        while True:
            polls += 1
            self.compute.poll()
            moved = 0
            deadline = time.monotonic() + budget_s
            while True:
                batch = self.bus.pump(self.deps, max_events=500)
                moved += batch
                if batch == 0 or time.monotonic() >= deadline:
                    break
            total += moved
            if moved == 0 or time.monotonic() - start >= budget_s \
                    or (max_polls is not None and polls >= max_polls):
                return total

    def tick(self) -> None:
        now = self.deps.clock.now()
        for doc in self.store.read(CLUSTERS, {}):
            if doc["state"] != "DELETED":
                self.inject(FleetTicked(cluster_id=doc["cluster_id"], at=now), "//mtc/scheduler")

    def run(self, until: Callable[[], bool], *, timeout_s: float, poll_s: float = 0.1,
            tick_s: float = 5.0) -> bool:
        """Pump until ``until()`` holds or the timeout passes; ticks keep heartbeats honest."""
        deadline = time.monotonic() + timeout_s
        next_tick = time.monotonic() + tick_s
        while time.monotonic() < deadline:
            self.pump(budget_s=10.0, max_polls=1)
            if until():
                return True
            if time.monotonic() >= next_tick:
                self.tick()
                next_tick = time.monotonic() + tick_s
            time.sleep(poll_s)
        return False

    def close(self) -> None:
        if isinstance(self.store, Closeable):
            self.store.close()


def embedded(state_dir: Path, *, compute: ComputeKind = "local", slurm_conf: str | None = None,
             config: ControlPlaneConfig | None = None, clock: Clock | None = None,
             compute_options: dict[str, Any] | None = None, verify: bool = False
             ) -> EmbeddedApp:
    """The control plane over ``state_dir`` (sqlite store, outbox bus) and ``compute``: local
    subprocess workers, or the Slurm cluster of ``slurm_conf`` (None: ``$SLURM_CONF``).
    A state whose files disagree is refused (``StateError``); ``verify`` (a server's start)
    also runs each database's integrity check."""
    from shared.adapters.clock import SystemClock
    from shared.adapters.sqlite_store import SqliteDocStore

    state_dir = private_dir(Path(state_dir).resolve())
    state_files.refuse_if_damaged(state_dir, integrity=verify)
    clock = clock or SystemClock()
    store = SqliteDocStore(state_dir / "mtc.db")
    bus = OutboxBus(store, control_plane_routes())
    webhook = webhook_from_env()  # MTC_ALERT_WEBHOOK: alerts POSTed as they are delivered
    if webhook is not None:
        bus.listeners.append(webhook)
    config = local_config(config, state_dir)
    if compute == "local":  # a root server's jobs are sandboxed away from these (sandbox.py)
        compute_options = {"output_root": config.output_root, "private_dirs": (state_dir,),
                           "sandboxed": None, "storage_floor": config.storage_floor,
                           "credentials": job_credentials.issuer(state_dir, store),
                           **(compute_options or {})}
    machines = make_compute(compute, state_dir, bus.inject, clock, slurm_conf=slurm_conf,
                            options=compute_options)
    deps = build_deps(store, clock=clock, compute=machines, publisher=bus, config=config)
    # the checkpoint advice, as a file beside each job's checkpoints (under the output root)
    deps = replace(deps, advice=FileAdviceSink(deps.config.output_root))
    return EmbeddedApp(state_dir, store, bus, machines, deps,
                       slurm_conf=slurm_conf if compute != "local" else None)
