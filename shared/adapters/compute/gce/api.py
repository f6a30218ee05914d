"""What the Compute Engine adapter asks of the Compute Engine API, through the official client.

``GceApi`` wraps ``google.cloud.compute_v1`` (``InstancesClient``, ``ZoneOperationsClient``)
into the few calls machine lifecycle needs; each mutating call returns the zone operation's
name at once (never ``.result()``: the adapter polls ``operation`` later). ``instance_body``
builds the ``Instance`` resource of a node from its pool's settings (machine type, GPUs,
``scheduling.provisioningModel`` STANDARD, SPOT or FLEX_START, reservation affinity).
``classify`` sorts every failure into transient (retry soon), capacity (a stock-out or a
quota: wait with backoff, visibly, never fail) and permanent (fail the request).

Clients are made on first use, never at import: ``google-cloud-compute`` is in ``mtc[gcp]``.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from shared.domain.model import Node

# the codes of operation errors (``error.errors[].code``) and of API errors (``reason``)
# that mean "no capacity now" (stock-out, quota): wait and retry, never fail
CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "QUOTA_EXCEEDED", "quotaExceeded", "RESOURCE_POOL_EXHAUSTED", "STOCKOUT",
    "NOT_ENOUGH_RESOURCES", "resourceExhausted"})
TRANSIENT_CODES = frozenset({
    "RATE_LIMIT_EXCEEDED", "rateLimitExceeded", "userRateLimitExceeded",
    "RESOURCE_OPERATION_RATE_EXCEEDED", "INTERNAL_ERROR", "backendError",
    "RESOURCE_NOT_READY", "resourceNotReady"})
PROVISIONING_MODELS = ("STANDARD", "SPOT", "FLEX_START")
FAULT_BEHAVIORS = ("PERFORMANCE", "SILENT_DATA_CORRUPTION", "UNRECOVERABLE_GPU_ERROR",
                   "BEHAVIOR_UNSPECIFIED")


class Failure(enum.StrEnum):
    TRANSIENT = "transient"
    CAPACITY = "capacity"
    PERMANENT = "permanent"


class GceError(Exception):
    """A call or an operation that failed, classified."""

    def __init__(self, kind: Failure, code: str, message: str) -> None:
        super().__init__(kind, code, message)
        self.kind, self.code, self.message = kind, code, message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class PoolSettings:
    """How a pool's machines are made (``GceConfig.pools`` by pool name, else ``default``)."""

    image: str = "projects/debian-cloud/global/images/family/debian-12"
    boot_disk_gb: int = 200
    provisioning_model: str = "STANDARD"
    reservation: str = ""  # a specific reservation name; "" consumes any matching one
    reservation_affinity: str = "ANY_RESERVATION"  # ANY_RESERVATION | SPECIFIC_RESERVATION | NO_RESERVATION
    max_run_duration_s: int = 0  # FLEX_START: how long the VM may run (0: not set)
    network: str = "global/networks/default"
    subnetwork: str = ""
    service_account: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.provisioning_model not in PROVISIONING_MODELS:
            raise ValueError(f"provisioning_model must be one of {PROVISIONING_MODELS}, "
                             f"got {self.provisioning_model!r}")


@dataclass(frozen=True)
class GceConfig:
    project: str
    zone: str
    pools: Mapping[str, PoolSettings] = field(default_factory=dict)
    default: PoolSettings = field(default_factory=PoolSettings)
    name_prefix: str = "mtc-"

    def pool(self, node: Node) -> PoolSettings:
        return self.pools.get(node.pool, self.default)


POOL_FIELDS = ("image", "boot_disk_gb", "provisioning_model", "reservation",
               "reservation_affinity", "max_run_duration_s", "network", "subnetwork",
               "service_account", "labels")


def config_from_dict(data: Mapping[str, Any], *, pools_key: str = "pools",
                     name_prefix: str = "mtc-") -> GceConfig:
    """``{"project", "zone", pools_key: {name: {PoolSettings fields...}}, "default": {...}}``
    (other keys of a pool, such as a power-saving nodeset's shape, are ignored here)."""
    for key in ("project", "zone"):
        if not data.get(key):
            raise ValueError(f"Compute Engine config: missing {key!r}")

    def pool(spec: Mapping[str, Any]) -> PoolSettings:
        return PoolSettings(**{k: v for k, v in spec.items() if k in POOL_FIELDS})

    return GceConfig(str(data["project"]), str(data["zone"]),
                     pools={n: pool(s) for n, s in (data.get(pools_key) or {}).items()},
                     default=pool(data.get("default") or {}),
                     name_prefix=str(data.get("name_prefix", name_prefix)))


def api_from_dict(config: GceConfig, data: Mapping[str, Any]) -> GceApi:
    """The client: Application Default Credentials, or with ``api_endpoint`` and
    ``"anonymous": true`` (a loopback endpoint only) the test stand-in."""
    endpoint = data.get("api_endpoint")
    credentials = None
    if data.get("anonymous"):
        if not endpoint or urlsplit(str(endpoint)).hostname not in ("127.0.0.1", "localhost",
                                                                    "::1"):
            raise ValueError("anonymous credentials are only for a loopback api_endpoint")
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return GceApi(config, api_endpoint=endpoint, credentials=credentials)


def instance_name(config: GceConfig, node_id: str) -> str:
    """A valid instance name for an mtc node (RFC 1035, at most 63 characters)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in (config.name_prefix + node_id).lower())
    base = base.strip("-") or "node"
    if not base[0].isalpha():
        base = "n-" + base
    if len(base) > 63:
        base = base[:54].rstrip("-") + "-" + uuid.uuid5(uuid.NAMESPACE_URL, node_id).hex[:8]
    return base


def request_id(key: str) -> str:
    """The ``requestId`` of one call: the same for every retry of it, so Compute Engine
    applies it once (a UUID, as the API requires)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "mtc:" + key))


def instance_body(config: GceConfig, node: Node, name: str) -> dict[str, Any]:
    """The ``Instance`` resource (REST JSON field names) of ``node``."""
    pool = config.pool(node)
    zone = f"zones/{config.zone}"
    sched: dict[str, Any] = {"provisioningModel": pool.provisioning_model}
    if node.accelerator_type and node.accelerator_count:
        sched["onHostMaintenance"] = "TERMINATE"  # VMs with GPUs cannot live-migrate
    if pool.provisioning_model in ("SPOT", "FLEX_START"):
        sched.update(automaticRestart=False, onHostMaintenance="TERMINATE",
                     instanceTerminationAction="DELETE" if pool.provisioning_model == "FLEX_START"
                     else "STOP")
    else:
        sched["automaticRestart"] = True
    if pool.max_run_duration_s:
        sched["maxRunDuration"] = {"seconds": str(pool.max_run_duration_s)}
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"{zone}/machineTypes/{node.machine_type}",
        "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                   "initializeParams": {"sourceImage": pool.image,
                                        "diskSizeGb": str(pool.boot_disk_gb)}}],
        "networkInterfaces": [{"network": pool.network,
                               **({"subnetwork": pool.subnetwork} if pool.subnetwork else {})}],
        "scheduling": sched,
        "labels": {"mtc-cluster": _label(node.cluster_id), "mtc-node": _label(node.node_id),
                   "mtc-pool": _label(node.pool), **dict(pool.labels)},
        "metadata": {"items": [{"key": "mtc-node-id", "value": node.node_id},
                               {"key": "mtc-cluster-id", "value": node.cluster_id}]},
    }
    if node.accelerator_type and node.accelerator_count:
        body["guestAccelerators"] = [{
            "acceleratorType": f"{zone}/acceleratorTypes/{_accelerator(node.accelerator_type)}",
            "acceleratorCount": node.accelerator_count}]
    if pool.reservation:
        body["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name", "values": [pool.reservation]}
    elif pool.provisioning_model == "STANDARD":
        body["reservationAffinity"] = {"consumeReservationType": pool.reservation_affinity}
    if pool.service_account:
        body["serviceAccounts"] = [{"email": pool.service_account,
                                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    return body


def _label(value: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in value.lower())[:63]


def _accelerator(vertex_name: str) -> str:
    """Vertex's ``NVIDIA_H100_80GB`` as Compute Engine's ``nvidia-h100-80gb``."""
    return vertex_name.lower().replace("_", "-")


FAULT_BEHAVIORS = ("PERFORMANCE", "SILENT_DATA_CORRUPTION", "UNRECOVERABLE_GPU_ERROR",
                   "BEHAVIOR_UNSPECIFIED")


def fault_behavior(reason: str) -> str:
    """The ``faultReasons[].behavior`` that fits a drain reason: the one an operator named
    (``reportFaultyNodes``), else a best effort by keyword."""
    named = [b for b in FAULT_BEHAVIORS if b in reason]
    if named:
        return min(named, key=reason.index)
    text = reason.lower()
    if any(k in text for k in ("slow", "speed", "straggl", "throttl", "performance")):
        return "PERFORMANCE"
    if any(k in text for k in ("corrupt", "sdc", "nan")):
        return "SILENT_DATA_CORRUPTION"
    if any(k in text for k in ("xid", "ecc", "gpu", "remap", "dcgm", "nvlink")):
        return "UNRECOVERABLE_GPU_ERROR"
    return "BEHAVIOR_UNSPECIFIED"


# ---------------------------------------------------------------- errors


def classify(exc: BaseException) -> GceError:
    """An exception from the client as transient, capacity or permanent."""
    if isinstance(exc, GceError):
        return exc
    from google.api_core import exceptions as gexc

    if isinstance(exc, gexc.GoogleAPICallError):
        reasons = [str(r) for r in (getattr(exc, "reason", None),) if r]
        for err in getattr(exc, "errors", None) or ():
            if isinstance(err, Mapping) and err.get("reason"):
                reasons.append(str(err["reason"]))
        code = reasons[0] if reasons else type(exc).__name__
        message = getattr(exc, "message", "") or str(exc)
        if any(r in CAPACITY_CODES for r in reasons) or "QUOTA_EXCEEDED" in message \
                or "RESOURCE_POOL_EXHAUSTED" in message:
            return GceError(Failure.CAPACITY, code, message)
        transient = (gexc.ServiceUnavailable, gexc.InternalServerError, gexc.TooManyRequests,
                     gexc.DeadlineExceeded, gexc.GatewayTimeout, gexc.BadGateway,
                     gexc.Aborted)
        if isinstance(exc, transient) or any(r in TRANSIENT_CODES for r in reasons):
            return GceError(Failure.TRANSIENT, code, message)
        return GceError(Failure.PERMANENT, code, message)
    if isinstance(exc, gexc.RetryError | TimeoutError | ConnectionError | OSError):
        return GceError(Failure.TRANSIENT, type(exc).__name__, str(exc))
    try:
        import requests
    except ImportError:  # pragma: no cover - requests comes with google-api-core
        pass
    else:
        if isinstance(exc, requests.RequestException):
            return GceError(Failure.TRANSIENT, type(exc).__name__, str(exc))
    return GceError(Failure.PERMANENT, type(exc).__name__, str(exc))


def operation_error(op: Mapping[str, Any]) -> GceError | None:
    """The error of a DONE operation (REST JSON), classified; None when it succeeded."""
    errors = ((op.get("error") or {}).get("errors")) or []
    if not errors:
        return None
    codes = [str(e.get("code", "")) for e in errors]
    message = "; ".join(str(e.get("message", "")) for e in errors)
    if any(c in CAPACITY_CODES for c in codes):
        return GceError(Failure.CAPACITY, codes[0], message)
    if any(c in TRANSIENT_CODES for c in codes):
        return GceError(Failure.TRANSIENT, codes[0], message)
    return GceError(Failure.PERMANENT, codes[0], message)


# ---------------------------------------------------------------- the client


class GceApi:
    """The Compute Engine calls of machine lifecycle (REST JSON in and out)."""

    def __init__(self, config: GceConfig, *, api_endpoint: str | None = None,
                 credentials: Any = None, timeout_s: float = 30.0) -> None:
        self.config = config
        self._endpoint = api_endpoint
        self._credentials = credentials
        self.timeout_s = timeout_s
        self._instances: Any = None
        self._operations: Any = None

    def _clients(self) -> tuple[Any, Any]:
        if self._instances is None:
            from google.cloud import compute_v1

            options = {"api_endpoint": self._endpoint} if self._endpoint else None
            self._instances = compute_v1.InstancesClient(
                credentials=self._credentials, transport="rest", client_options=options)
            self._operations = compute_v1.ZoneOperationsClient(
                credentials=self._credentials, transport="rest", client_options=options)
        return self._instances, self._operations

    @property
    def _where(self) -> dict[str, str]:
        return {"project": self.config.project, "zone": self.config.zone}

    @staticmethod
    def _json(message: Any) -> dict[str, Any]:
        return type(message).to_dict(message, preserving_proto_field_name=False)  # type: ignore[no-any-return]

    def _call(self, verb: str, request: str, **fields: Any) -> str:
        """One mutating call (``request``: the client's request class, which carries the
        ``requestId``); the zone operation's name."""
        from google.cloud import compute_v1

        instances, _ = self._clients()
        req = getattr(compute_v1, request)(**self._where, **fields)
        try:
            op = getattr(instances, verb)(request=req, timeout=self.timeout_s, retry=None)
        except Exception as exc:  # every failure is classified, none escapes
            raise classify(exc) from exc
        return str(op.name)

    def insert(self, body: Mapping[str, Any], key: str) -> str:
        from google.cloud import compute_v1

        resource = compute_v1.Instance.from_json(_dumps(body), ignore_unknown_fields=False)
        return self._call("insert", "InsertInstanceRequest", instance_resource=resource,
                          request_id=request_id(key))

    def act(self, verb: str, name: str, key: str) -> str:
        """``delete``, ``reset``, ``stop`` or ``start`` the instance."""
        request = {"delete": "DeleteInstanceRequest", "reset": "ResetInstanceRequest",
                   "stop": "StopInstanceRequest", "start": "StartInstanceRequest"}[verb]
        return self._call(verb, request, instance=name, request_id=request_id(key))

    def report_host_as_faulty(self, name: str, key: str, reasons: Sequence[tuple[str, str]]
                              ) -> str:
        from google.cloud import compute_v1

        body = compute_v1.InstancesReportHostAsFaultyRequest(
            disruption_schedule="IMMEDIATE",
            fault_reasons=[compute_v1.InstancesReportHostAsFaultyRequestFaultReason(
                behavior=b, description=d[:1000]) for b, d in reasons])
        return self._call("report_host_as_faulty", "ReportHostAsFaultyInstanceRequest",
                          instance=name, instances_report_host_as_faulty_request_resource=body,
                          request_id=request_id(key))

    def get(self, name: str) -> dict[str, Any] | None:
        """The instance (REST JSON), or None when it does not exist."""
        from google.api_core import exceptions as gexc

        instances, _ = self._clients()
        try:
            inst = instances.get(**self._where, instance=name, timeout=self.timeout_s, retry=None)
        except gexc.NotFound:
            return None
        except Exception as exc:
            raise classify(exc) from exc
        return self._json(inst)

    def operation(self, name: str, *, wait: bool = False) -> dict[str, Any]:
        """The zone operation (REST JSON); ``wait`` uses ``zoneOperations.wait`` (which
        returns when it is DONE or after the server's own limit, whichever is first)."""
        _, operations = self._clients()
        verb = operations.wait if wait else operations.get
        try:
            op = verb(**self._where, operation=name, timeout=self.timeout_s, retry=None)
        except Exception as exc:
            raise classify(exc) from exc
        out = self._json(op)
        out["status"] = _status_name(op)
        return out


def _status_name(op: Any) -> str:
    status = getattr(op, "status", None)
    return str(getattr(status, "name", status) or "")


def _dumps(body: Mapping[str, Any]) -> str:
    import json

    return json.dumps(dict(body))
