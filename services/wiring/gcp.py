"""The Google Cloud wiring: Firestore store, Pub/Sub publisher, compute, for every function.

``services.wiring.runtime`` calls :func:`gcp_runtime` on the first request when ``MTC_BACKEND=gcp``
(on Cloud Functions, or locally against the emulators). Nothing is built at import time.

Environment:
  GOOGLE_CLOUD_PROJECT     project id (required; the emulators accept any id)
  FIRESTORE_EMULATOR_HOST  / PUBSUB_EMULATOR_HOST: use the emulators (read by the clients)
  MTC_TOPIC_PREFIX         topic/subscription prefix                      (default "mtc-")
  MTC_COLLECTION_PREFIX    Firestore collection prefix                    (default "")
  MTC_COMPUTE              "local": LocalCompute over MTC_STATE_DIR (the emulator stack);
                           "remote": each call is a request on mtc-compute-requests for the
                           executor beside the machines (services.executor);
                           "none": requests are logged only                (default "local")
  MTC_COMPUTE_TTL_S        remote: a request's deadline after it was issued (default 300)
  MTC_STATE_DIR            LocalCompute's state and job outputs           (default var/gcp)
  MTC_AGENT_INTERVAL_S     LocalCompute's heartbeat period                (default 1.0)
  MTC_GRACE_PERIOD_S       SIGTERM-to-SIGKILL grace given to jobs          (default config)
  MTC_HEARTBEAT_TIMEOUT_S  silence after which a node is reported lost     (default config)
  MTC_REPAIR_CONFIG        JSON repair policy knobs (load_repair_config)   (default config)
  MTC_LOCAL_COMPUTE        JSON LocalCompute timings: provision_duration_s,
                           repair_durations_s {action: s}                 (LocalCompute's)
  MTC_PROVISIONING         "events" or "workflow": the provisioning service starts the
                           mtc-provision-cluster workflow in MTC_WORKFLOW_LOCATION
  K_SERVICE                the function's name (set by Cloud Run): the CloudEvent source
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.wiring.builder import build_deps, local_config, make_compute
from shared.adapters.clock import SystemClock
from shared.adapters.compute.remote.codec import DEFAULT_TTL_S
from shared.adapters.event_log import DocEventLog, LoggingPublisher
from shared.adapters.firestore_store import FirestoreDocStore
from shared.adapters.outbox import DocOutbox
from shared.adapters.pubsub import PREFIX, PubSubDeadLetters, PubSubPublisher
from shared.config import ControlPlaneConfig
from shared.domain.health import RepairAction
from shared.domain.model import Node
from shared.ports import Clock, Closeable, Compute, DocStore, Gang

log = logging.getLogger("mtc.gcp")


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
    compute_ttl_s: float = DEFAULT_TTL_S  # remote: how long a request may wait to be applied
    source: str = "//mtc/control-plane"
    provisioning: str = "events"  # "workflow": Cloud Workflows drives provisioning
    workflow_location: str = ""

    def config(self) -> ControlPlaneConfig:
        """The control-plane settings these environment settings imply."""
        config = local_config(None, self.state_dir)
        if self.grace_period_s is not None:
            config = dataclasses.replace(config, grace_period_s=self.grace_period_s)
        if self.heartbeat_timeout_s is not None:
            config = dataclasses.replace(config, heartbeat_timeout_s=self.heartbeat_timeout_s)
        if self.repair_config:
            from shared.policies.repair import load_repair_config

            repair = load_repair_config(json.loads(self.repair_config))
            config = dataclasses.replace(config, repair=repair)
        return dataclasses.replace(config, provisioning=self.provisioning)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GcpSettings:
        env = os.environ if env is None else env
        project = env.get("GOOGLE_CLOUD_PROJECT") or env.get("GCP_PROJECT") or ""
        if not project:
            raise RuntimeError("MTC_BACKEND=gcp needs GOOGLE_CLOUD_PROJECT (any id works "
                               "against the emulators)")
        compute = env.get("MTC_COMPUTE", "local")
        if compute not in ("local", "remote", "none"):
            raise RuntimeError(f"MTC_COMPUTE must be local, remote or none, got {compute!r}")
        ttl = float(env.get("MTC_COMPUTE_TTL_S") or DEFAULT_TTL_S)
        if not ttl > 0:
            raise RuntimeError(f"MTC_COMPUTE_TTL_S must be positive, got {ttl!r}")
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
            compute_ttl_s=ttl,
            source=f"//mtc/{service}" if service else "//mtc/control-plane",
            provisioning=_one_of(env.get("MTC_PROVISIONING", "events"), "MTC_PROVISIONING",
                                 ("events", "workflow")),
            workflow_location=env.get("MTC_WORKFLOW_LOCATION", ""),
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

    def start_workers(self, gang: Gang) -> None:
        log.info("compute: start %s attempt %d, %d worker(s)", gang.job_id, gang.attempt,
                 gang.world_size)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        log.info("compute: SIGTERM %s attempt %d", job_id, attempt)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        log.info("compute: stop %s attempt %d", job_id, attempt)


class GcpRuntime:
    """Deps for every function: Firestore units of work, Pub/Sub publishing, compute.

    Handlers publish through ``run_handler`` and the HTTP API and workflow steps through
    ``command_unit``, each right after its own commit. What a crash leaves in the outbox, the
    sweeper (``POST /tick`` on the steps function) publishes."""

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
        self.compute = compute or self._make_compute()
        config = config or settings.config()
        self.event_log = DocEventLog(self.store, retention_s=config.retention_s)
        self.deps = build_deps(
            self.store, clock=self.clock, compute=self.compute,
            publisher=LoggingPublisher(self.publisher, self.event_log),
            config=config, source=settings.source, with_event_log=False,
            outbox=self.outbox,
            dead_letters=PubSubDeadLetters(self.store, self.publisher))
        self.deps = dataclasses.replace(self.deps, event_log=self.event_log)
        if settings.provisioning == "workflow":  # the provisioning function starts it
            from shared.adapters.workflows import CloudWorkflows

            self.deps = dataclasses.replace(self.deps, workflows=CloudWorkflows(
                settings.project, settings.workflow_location or "us-central1"))

    def _make_compute(self) -> Compute:
        if self.settings.compute == "none":
            return NullCompute()
        if self.settings.compute == "remote":
            from shared.adapters.compute.remote.compute import RemoteCompute
            from shared.adapters.compute.remote.pubsub import PubSubRequestSink

            sink = PubSubRequestSink(self.settings.project, prefix=self.settings.topic_prefix)
            return RemoteCompute(sink, self.clock, ttl_s=self.settings.compute_ttl_s)
        options = {"agent_interval_s": self.settings.agent_interval_s,
                   **local_compute_options(self.settings.local_compute)}
        return make_compute("local", self.settings.state_dir, self.publisher.publish,
                            self.clock, options=options)

    def after_request(self) -> None:
        """Nothing is left to do: every unit of work published its events after its commit."""

    def close(self) -> None:
        if isinstance(self.compute, Closeable):
            self.compute.close()


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


def _one_of(value: str, name: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise RuntimeError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value
