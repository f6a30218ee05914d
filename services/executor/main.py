"""``python -m services.executor``: the compute executor as a long-running process.

It runs beside the machines (on the Slurm controller or login node), with the identity of a
service account that may pull from its own subscription of ``mtc-compute-requests``, publish
to the event topics and the dead-letter topic, and write its liveness document
(``executors/<id>`` in Firestore). It needs no inbound network access: it only pulls.

Environment:
  GOOGLE_CLOUD_PROJECT     project id (required; any id against the emulators)
  PUBSUB_EMULATOR_HOST / FIRESTORE_EMULATOR_HOST: use the emulators (read by the clients)
  MTC_EXECUTOR_ID          this executor's name: its subscription and liveness doc (default
                           the host name)
  MTC_EXECUTOR_COMPUTE     "slurm" (SlurmCompute), "gce" (Compute Engine machines, Slurm
                           workers) or "local" (LocalCompute)  (default slurm)
  MTC_STATE_DIR            the adapter's state and the dedup record      (default var/executor)
  SLURM_CONF               the cluster's slurm.conf (slurm)
  MTC_EXECUTOR_OPTIONS     JSON keyword arguments for the adapter (e.g. agent_interval_s,
                           agent_probes for SlurmCompute)
  MTC_TOPIC_PREFIX / MTC_COLLECTION_PREFIX   as for the functions          (default "mtc-"/"")
  MTC_EXECUTOR_HEARTBEAT_S how often the liveness doc is overwritten      (default 5)
  MTC_EXECUTOR_POLL_S      how often the adapter is polled at least        (default 0.1)
  MTC_EXECUTOR_RECONCILE_S how often the announced attempt facts are compared with the
                           store, and what it is missing re-announced; 0: never (default 30)
  MTC_EXECUTOR_SETTLE_S    how long the bus has to deliver a fact before it is re-announced
                           (then a doubling gap, at most 30 min)            (default 120)

SIGTERM or SIGINT stops it after the current step; what it had pulled but not acknowledged
is redelivered to its next run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.executor.announced import AnnouncedRecord, Recording
from services.executor.dedup import DedupRecord
from services.executor.executor import Executor
from services.executor.placements import StorePlacements
from services.executor.reconcile import Reconciler, StoreJobViews
from services.wiring.builder import COMPUTE_SOURCES, make_compute
from shared import logs
from shared.adapters.clock import SystemClock
from shared.adapters.outbox import SourceEmitter
from shared.adapters.pubsub import PREFIX, PubSubPublisher
from shared.policies.reconcile import Limits
from shared.ports import Closeable

log = logging.getLogger("mtc.executor")


@dataclass(frozen=True)
class ExecutorSettings:
    project: str
    executor_id: str
    compute: str = "slurm"
    state_dir: Path = Path("var/executor")
    slurm_conf: str | None = None
    options: str = ""
    topic_prefix: str = PREFIX
    collection_prefix: str = ""
    heartbeat_s: float = 5.0
    poll_s: float = 0.1
    reconcile_s: float = 30.0
    settle_s: float = 120.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExecutorSettings:
        env = os.environ if env is None else env
        project = env.get("GOOGLE_CLOUD_PROJECT") or env.get("GCP_PROJECT") or ""
        if not project:
            raise SystemExit("executor: GOOGLE_CLOUD_PROJECT is required")
        compute = env.get("MTC_EXECUTOR_COMPUTE", "slurm")
        if compute not in ("slurm", "gce", "local"):
            raise SystemExit(f"executor: MTC_EXECUTOR_COMPUTE must be slurm, gce or local, "
                             f"got {compute!r}")
        executor_id = env.get("MTC_EXECUTOR_ID") or socket.gethostname()
        if not executor_id.replace("-", "").isalnum() or len(executor_id) > 60:
            raise SystemExit("executor: MTC_EXECUTOR_ID must be letters, digits and '-' "
                             "(at most 60)")
        return cls(project=project, executor_id=executor_id, compute=compute,
                   state_dir=Path(env.get("MTC_STATE_DIR", "var/executor")),
                   slurm_conf=env.get("SLURM_CONF") or None,
                   options=env.get("MTC_EXECUTOR_OPTIONS", ""),
                   topic_prefix=env.get("MTC_TOPIC_PREFIX", PREFIX),
                   collection_prefix=env.get("MTC_COLLECTION_PREFIX", ""),
                   heartbeat_s=float(env.get("MTC_EXECUTOR_HEARTBEAT_S", "5")),
                   poll_s=float(env.get("MTC_EXECUTOR_POLL_S", "0.1")),
                   reconcile_s=float(env.get("MTC_EXECUTOR_RECONCILE_S", "30")),
                   settle_s=float(env.get("MTC_EXECUTOR_SETTLE_S", "120")))

    def adapter_options(self) -> dict[str, Any]:
        if not self.options:
            return {}
        raw = json.loads(self.options)
        if not isinstance(raw, dict):
            raise SystemExit("executor: MTC_EXECUTOR_OPTIONS must be a JSON object")
        if "agent_probes" in raw:
            raw["agent_probes"] = tuple(raw["agent_probes"])
        return raw


def build(settings: ExecutorSettings) -> tuple[Executor, Any]:
    """The executor over Pub/Sub and Firestore, and the compute adapter (to close)."""
    from shared.adapters.compute.remote.pubsub import (
        PubSubRequestSink,
        PubSubRequestSource,
        ensure_request_topology,
    )
    from shared.adapters.firestore_store import FirestoreDocStore

    clock = SystemClock()
    publisher = PubSubPublisher(settings.project, prefix=settings.topic_prefix)
    recording = Recording(publisher.publish, AnnouncedRecord(settings.state_dir / "executor"))
    compute = make_compute(settings.compute,  # type: ignore[arg-type]
                           settings.state_dir, recording, clock,
                           slurm_conf=settings.slurm_conf, options=settings.adapter_options())
    subscription = ensure_request_topology(settings.project, settings.executor_id,
                                           prefix=settings.topic_prefix)
    store = FirestoreDocStore.connect(settings.project, prefix=settings.collection_prefix)
    executor = Executor(
        PubSubRequestSource(settings.project, subscription), compute,
        DedupRecord(settings.state_dir / "executor"), clock,
        refusals=PubSubRequestSink(settings.project, prefix=settings.topic_prefix),
        liveness=store, executor_id=settings.executor_id, kind=settings.compute,
        heartbeat_s=settings.heartbeat_s,
        report=SourceEmitter(recording, clock,
                             COMPUTE_SOURCES.get(settings.compute, "//mtc/executor")),
        reconciler=Reconciler(recording.record, StoreJobViews(store), publisher.publish, clock,
                              Limits(settle_s=settings.settle_s),
                              every_s=settings.reconcile_s),
        placements=StorePlacements(store))
    log.info("executor %s: %s compute over %s, pulling %s", settings.executor_id,
             settings.compute, settings.state_dir, subscription)
    return executor, compute


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.executor",
                                     description="apply mtc compute requests beside the "
                                     "machines (configured by the environment)")
    parser.parse_args(argv)
    logs.setup()
    settings = ExecutorSettings.from_env()
    executor, compute = build(settings)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("executor: signal %d, stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        executor.run(stop, settings.poll_s)
    finally:
        for held in (executor.source, compute):
            if isinstance(held, Closeable):
                held.close()
        executor.dedup.close()
        if isinstance(executor.reconciler, Reconciler):
            executor.reconciler.record.close()
    return 0
