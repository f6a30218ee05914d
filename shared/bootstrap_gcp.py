"""The Google Cloud wiring: Firestore store, Pub/Sub publisher, compute, for every function.

``services.runtime`` calls :func:`gcp_runtime` on the first request when ``MTC_BACKEND=gcp``
(on Cloud Functions, or locally against the emulators). Nothing is built at import time.

Environment:
  GOOGLE_CLOUD_PROJECT     project id (required; the emulators accept any id)
  FIRESTORE_EMULATOR_HOST  / PUBSUB_EMULATOR_HOST: use the emulators (read by the clients)
  MTC_TOPIC_PREFIX         topic/subscription prefix                      (default "mtc-")
  MTC_COLLECTION_PREFIX    Firestore collection prefix                    (default "")
  MTC_COMPUTE              "local": LocalCompute over MTC_STATE_DIR (the emulator stack);
                           "none": requests are logged only                (default "local")
  MTC_STATE_DIR            LocalCompute's state and job outputs           (default var/gcp)
  MTC_AGENT_INTERVAL_S     LocalCompute's heartbeat period                (default 1.0)
  MTC_GRACE_PERIOD_S       SIGTERM-to-SIGKILL grace given to jobs          (default config)
  MTC_HEARTBEAT_TIMEOUT_S  silence after which a node is reported lost     (default config)
  MTC_REPAIR_CONFIG        JSON repair policy knobs (load_repair_config)   (default config)
  MTC_LOCAL_COMPUTE        JSON LocalCompute timings: provision_duration_s,
                           repair_durations_s {action: s}                 (LocalCompute's)
  K_SERVICE                the function's name (set by Cloud Run): the CloudEvent source
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from shared.adapters.docstore import DocOutbox, DocStore, DocUnitOfWork, make_envelope
from shared.adapters.firestore_store import FirestoreDocStore
from shared.adapters.pubsub import PREFIX, PubSubDeadLetters, PubSubPublisher
from shared.bootstrap import SystemClock
from shared.config import ControlPlaneConfig
from shared.domain.events import Envelope, Event
from shared.domain.health import RepairAction
from shared.domain.model import Node
from shared.handling import Deps, publish_all
from shared.ports import Clock, Compute, Outbox, Publisher, WorkerSpec

log = logging.getLogger("mtc.gcp")

COMPUTE_SOURCE = "//mtc/compute/local"
MAX_TRACKED = 64  # units of work remembered per thread between two after_request calls


@dataclass(frozen=True)
class GcpSettings:
    project: str
    topic_prefix: str = PREFIX
    collection_prefix: str = ""
    compute: str = "local"
    state_dir: Path = Path("var/gcp")
    agent_interval_s: float = 1.0
    grace_period_s: float | None = None
    heartbeat_timeout_s: float | None = None
    repair_config: str = ""  # JSON for shared.policies.repair.load_repair_config
    local_compute: str = ""  # JSON: LocalCompute options (provision_duration_s, ...)
    source: str = "//mtc/control-plane"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GcpSettings:
        env = os.environ if env is None else env
        project = env.get("GOOGLE_CLOUD_PROJECT") or env.get("GCP_PROJECT") or ""
        if not project:
            raise RuntimeError("MTC_BACKEND=gcp needs GOOGLE_CLOUD_PROJECT (any id works "
                               "against the emulators)")
        compute = env.get("MTC_COMPUTE", "local")
        if compute not in ("local", "none"):
            raise RuntimeError(f"MTC_COMPUTE must be local or none, got {compute!r}")
        grace = env.get("MTC_GRACE_PERIOD_S")
        heartbeat = env.get("MTC_HEARTBEAT_TIMEOUT_S")
        service = env.get("K_SERVICE")
        return cls(
            project=project,
            topic_prefix=env.get("MTC_TOPIC_PREFIX", PREFIX),
            collection_prefix=env.get("MTC_COLLECTION_PREFIX", ""),
            compute=compute,
            state_dir=Path(env.get("MTC_STATE_DIR", "var/gcp")),
            agent_interval_s=float(env.get("MTC_AGENT_INTERVAL_S", "1.0")),
            grace_period_s=float(grace) if grace else None,
            heartbeat_timeout_s=float(heartbeat) if heartbeat else None,
            repair_config=env.get("MTC_REPAIR_CONFIG", ""),
            local_compute=env.get("MTC_LOCAL_COMPUTE", ""),
            source=f"//mtc/{service}" if service else "//mtc/control-plane",
        )


class NullCompute:
    """No machines behind this deployment: every request is logged, nothing happens."""

    def provision_node(self, node: Node) -> None:
        log.info("compute: provision %s (no compute backend)", node.node_id)

    def cordon(self, node_id: str, reason: str) -> None:
        log.info("compute: cordon %s (%s)", node_id, reason)

    def uncordon(self, node_id: str) -> None:
        log.info("compute: uncordon %s", node_id)

    def delete_node(self, node_id: str) -> None:
        log.info("compute: delete %s", node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        log.info("compute: repair %s %s #%d", node_id, action, attempt)

    def start_workers(self, workers: Sequence[WorkerSpec]) -> None:
        log.info("compute: start %d worker(s)", len(workers))

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        log.info("compute: SIGTERM %s attempt %d", job_id, attempt)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        log.info("compute: stop %s attempt %d", job_id, attempt)


class _Scope(threading.local):
    """What one request thread did: its units of work and what it already published."""

    def __init__(self) -> None:
        self.uows: list[DocUnitOfWork] = []
        self.published: set[str] = set()


class _TrackingPublisher:
    def __init__(self, inner: Publisher, scope: _Scope) -> None:
        self.inner = inner
        self._scope = scope

    def publish(self, envelope: Envelope) -> None:
        self.inner.publish(envelope)
        self._scope.published.add(envelope.id)


class GcpRuntime:
    """Deps for every function: Firestore units of work, Pub/Sub publishing, compute.

    Events a handler emits are published by ``run_handler`` right after its commit. The
    HTTP API commits its own units of work and then calls ``after_request``, which
    publishes whatever this thread committed and has not published yet. What a crash
    leaves in the outbox, the sweeper (``POST /tick`` on the steps function) publishes."""

    def __init__(self, settings: GcpSettings, *, store: DocStore | None = None,
                 publisher: PubSubPublisher | None = None, compute: Compute | None = None,
                 clock: Clock | None = None, config: ControlPlaneConfig | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.store: DocStore = store or FirestoreDocStore.connect(
            settings.project, prefix=settings.collection_prefix)
        self.publisher = publisher or PubSubPublisher(settings.project,
                                                      prefix=settings.topic_prefix)
        self.outbox = DocOutbox(self.store)
        self._scope = _Scope()
        self.compute = compute or self._make_compute()
        if config is None:
            config = ControlPlaneConfig(output_root=(settings.state_dir / "jobs").resolve(),
                                        python=sys.executable)
            if settings.grace_period_s is not None:
                config = dataclasses.replace(config, grace_period_s=settings.grace_period_s)
            if settings.heartbeat_timeout_s is not None:
                config = dataclasses.replace(config,
                                             heartbeat_timeout_s=settings.heartbeat_timeout_s)
            if settings.repair_config:
                from shared.policies.repair import load_repair_config

                repair = load_repair_config(json.loads(settings.repair_config))
                config = dataclasses.replace(config, repair=repair)
        self.deps = Deps(
            uow=self._new_uow,
            clock=self.clock,
            compute=self.compute,
            publisher=_TrackingPublisher(self.publisher, self._scope),
            config=config,
            dead_letters=PubSubDeadLetters(self.store, self.publisher),
            event_log=None,
            outbox=cast(Outbox, self.outbox),  # DocOutbox takes list[str]: compatible
        )

    def _make_compute(self) -> Compute:
        if self.settings.compute == "none":
            return NullCompute()
        from shared.adapters.local_compute import LocalCompute

        options = local_compute_options(self.settings.local_compute)
        return LocalCompute(self.settings.state_dir / "compute", self.emit_compute, self.clock,
                            agent_interval_s=self.settings.agent_interval_s, **options)

    def _new_uow(self) -> DocUnitOfWork:
        uow = DocUnitOfWork(self.store, source=self.settings.source, clock=self.clock.now)
        tracked = self._scope.uows
        tracked.append(uow)
        del tracked[:-MAX_TRACKED]
        return uow

    def after_request(self) -> None:
        scope = self._scope
        uows, published = scope.uows, scope.published
        scope.uows, scope.published = [], set()
        pending = [env for uow in uows for env in uow.committed if env.id not in published]
        if pending:
            publish_all(dataclasses.replace(self.deps, publisher=self.publisher), pending)

    def emit(self, event: Event, source: str) -> Envelope:
        """Publish an event from outside any transaction (compute, agents, tools)."""
        env = make_envelope(event, source, self.clock.now())
        self.publisher.publish(env)
        return env

    def emit_compute(self, event: Event) -> None:
        self.emit(event, COMPUTE_SOURCE)

    def close(self) -> None:
        close = getattr(self.compute, "close", None)
        if close is not None:
            close()


def local_compute_options(text: str) -> dict[str, Any]:
    """``{"provision_duration_s": 2, "repair_durations_s": {"reboot": 2}}`` -> LocalCompute
    keyword arguments. Machines that answer at once can report a result before the
    transaction that asked for it has committed; real ones take minutes."""
    if not text:
        return {}
    raw = json.loads(text)
    if not isinstance(raw, dict) or not set(raw) <= {"provision_duration_s",
                                                     "repair_durations_s"}:
        raise RuntimeError(f"MTC_LOCAL_COMPUTE: unexpected {text!r}")
    options: dict[str, Any] = {}
    if "provision_duration_s" in raw:
        options["provision_duration_s"] = float(raw["provision_duration_s"])
    if "repair_durations_s" in raw:
        options["repair_durations_s"] = {RepairAction(k): float(v)
                                         for k, v in raw["repair_durations_s"].items()}
    return options


def gcp_runtime(**overrides: Any) -> GcpRuntime:
    return GcpRuntime(GcpSettings.from_env(), **overrides)
