"""The control plane over a real Slurm cluster: sqlite store, outbox bus, ``SlurmCompute``.

The same wiring as ``bootstrap.embedded`` (and the same ``EmbeddedApp``: ``pump``/``run``
poll compute and deliver events), with ``SlurmCompute`` in place of ``LocalCompute``. Health
reports of the node agents are published with the source an agent uses for ``--publish-url``
(``//mtc/node-agent/<node>``), so they look the same as reports posted from a node.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from services.node_agent.publish import event_source
from shared.adapters.docstore import make_envelope
from shared.adapters.outbox_bus import OutboxBus
from shared.adapters.slurm_compute import SlurmCompute
from shared.adapters.sqlite_store import SqliteDocStore
from shared.bootstrap import EmbeddedApp, SystemClock, build_deps
from shared.config import ControlPlaneConfig
from shared.domain.events import Event, NodeHealthReported
from shared.ports import Clock

COMPUTE_SOURCE = "//mtc/compute/slurm"


def slurm_app(
    state_dir: Path,
    slurm_conf: str | None = None,
    *,
    config: ControlPlaneConfig | None = None,
    clock: Clock | None = None,
    compute_options: dict[str, Any] | None = None,
) -> EmbeddedApp:
    """The whole control plane in this process, driving the Slurm cluster of ``slurm_conf``
    (None: the client's default, ``$SLURM_CONF``). ``app.compute`` is the ``SlurmCompute``."""
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    clock = clock or SystemClock()
    config = config or ControlPlaneConfig()
    if config.output_root == ControlPlaneConfig().output_root:
        config = replace(config, output_root=state_dir / "jobs", python=sys.executable)
    store = SqliteDocStore(state_dir / "mtc.db")
    bus = OutboxBus(store)

    def emit(event: Event) -> None:
        source = COMPUTE_SOURCE
        if isinstance(event, NodeHealthReported) and event.source == "agent":
            source = event_source(event.node_id)
        bus.inject(make_envelope(event, source, clock.now()))

    compute = SlurmCompute(
        state_dir / "compute", emit, clock, slurm_conf=slurm_conf, **(compute_options or {})
    )
    deps = build_deps(store, clock=clock, compute=compute, publisher=bus, config=config)
    return EmbeddedApp(state_dir, store, bus, compute, deps)
