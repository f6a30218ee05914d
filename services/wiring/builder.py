"""THE composition root: the one place that picks implementations.

Every app is built here from the same parts: a document store (sqlite, memory, Firestore), a
publisher (the embedded outbox bus, Pub/Sub, the twin's SimPy bus), a Compute (local
subprocesses, Slurm, nothing, the twin's fleet), a clock, the settings and the routes. The
embedded default, embedded over Slurm (``embedded.py``), Google Cloud and its emulators
(``gcp.py``), the functions-framework entry points (``functions.py``) and the SimPy twin
(``simulator.twin``) all call ``build_deps``; only the choice of parts differs.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from shared.adapters.docstore import DocEventLog, DocUnitsOfWork
from shared.adapters.outbox import SourceEmitter
from shared.adapters.outbox_bus import DocDeadLetters
from shared.adapters.uow_pool import PooledUnitsOfWork
from shared.config import ControlPlaneConfig
from shared.domain.events import Event, NodeHealthReported
from shared.handling import DeadLetters, Deps
from shared.ports import Clock, Compute, DocStore, Outbox, Publisher

ComputeKind = Literal["local", "slurm", "gce"]
COMPUTE_SOURCES: dict[str, str] = {"local": "//mtc/compute/local", "slurm": "//mtc/compute/slurm",
                                   "gce": "//mtc/compute/gce"}


def build_deps(store: DocStore, *, clock: Clock, compute: Compute, publisher: Publisher,
               config: ControlPlaneConfig | None = None, source: str = "//mtc/control-plane",
               with_event_log: bool = True, outbox: Outbox | None = None,
               dead_letters: DeadLetters | None = None, pooled: bool = False) -> Deps:
    """What every handler gets: units of work over ``store``, and the other ports.
    ``pooled``: units of work that ended are handed out again (the twin, which builds one per
    delivery millions of times); else a new one per call."""
    units = PooledUnitsOfWork if pooled else DocUnitsOfWork
    return Deps(
        uow=units(store, source=source, clock=clock.now),
        clock=clock,
        compute=compute,
        publisher=publisher,
        config=config or ControlPlaneConfig(),
        dead_letters=dead_letters or DocDeadLetters(store),
        event_log=DocEventLog(store) if with_event_log else None,
        outbox=outbox,
    )


def local_config(config: ControlPlaneConfig | None, root: Path) -> ControlPlaneConfig:
    """Job outputs under ``root/jobs`` and workers on this interpreter, unless configured."""
    config = config or ControlPlaneConfig()
    if config.output_root == ControlPlaneConfig().output_root:
        config = replace(config, output_root=(root / "jobs").resolve(), python=sys.executable)
    return config


def agent_source(event: Event) -> str | None:
    """A node agent's report keeps the source the agent itself publishes with."""
    if isinstance(event, NodeHealthReported) and event.source == "agent":
        from services.node_agent.publish import event_source

        return event_source(event.node_id)
    return None


def make_compute(kind: ComputeKind, state_dir: Path, sink: Any, clock: Clock, *,
                 slurm_conf: str | None = None, options: dict[str, Any] | None = None
                 ) -> Compute:
    """A Compute over ``state_dir/compute`` whose results go to ``sink(envelope)``."""
    options = options or {}
    if kind == "local":
        from shared.adapters.compute.local.compute import LocalCompute

        emit = SourceEmitter(sink, clock, COMPUTE_SOURCES["local"])
        return LocalCompute(state_dir / "compute", emit, clock, **options)
    if kind == "slurm":
        from shared.adapters.compute.slurm.compute import SlurmCompute

        emit = SourceEmitter(sink, clock, COMPUTE_SOURCES["slurm"], source_for=agent_source)
        return SlurmCompute(state_dir / "compute", emit, clock, slurm_conf=slurm_conf, **options)
    if kind == "gce":  # machines from Compute Engine, workers through Slurm on them
        from shared.adapters.compute.gce.split import gce_over_slurm

        emit = SourceEmitter(sink, clock, COMPUTE_SOURCES["gce"], source_for=agent_source)
        return gce_over_slurm(state_dir / "compute", emit, clock, slurm_conf=slurm_conf,
                              **options)
    raise ValueError(f"compute must be local, slurm or gce, got {kind!r}")
