"""``RemoteCompute``: the Compute port of the cloud control plane, which has no machines.

Each call becomes a compute request (``codec``) published to ``mtc-compute-requests``
and returns at once, as the port asks; the executor beside the machines
(``services.executor``) applies it with a real adapter and publishes what the machines did
as the usual result events (node.provisioned, job.workers_exited, ...), which reach the
handlers as every other event does. The functions therefore never need a shell, a Slurm
client or a credential on the cluster.

A publish that fails raises (a transient error): the handler's transaction is not
committed, the triggering event is redelivered and the call is made again, under the same
request id, so the executor applies it once.
"""

from __future__ import annotations

import itertools
from typing import Protocol

from shared.adapters.compute.remote.codec import (
    DEFAULT_TTL_S,
    ComputeRequest,
    gang_args,
    make_request,
)
from shared.domain.health import RepairAction
from shared.domain.model import Node
from shared.ports import Clock, Gang


class RequestSink(Protocol):
    """Where requests go: the Pub/Sub topic (``pubsub``) or an in-process queue."""

    def send(self, request: ComputeRequest) -> None: ...


class RemoteCompute:
    """The ``Compute`` port as requests to an executor (see the module docstring)."""

    def __init__(self, sink: RequestSink, clock: Clock, *, ttl_s: float = DEFAULT_TTL_S
                 ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self._sink = sink
        self._clock = clock
        self.ttl_s = ttl_s
        self._calls = itertools.count(1)  # cordon/uncordon: each call is its own request

    def _send(self, op: str, **args: object) -> None:
        self._sink.send(make_request(op, args, self._clock.now(), self.ttl_s))

    def provision_node(self, node: Node) -> None:
        self._send("provision_node", node=node.to_dict())

    def cordon(self, node_id: str, reason: str) -> None:
        self._send("cordon", node_id=node_id, reason=reason, seq=next(self._calls))

    def uncordon(self, node_id: str) -> None:
        self._send("uncordon", node_id=node_id, seq=next(self._calls))

    def delete_node(self, node_id: str) -> None:
        self._send("delete_node", node_id=node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        self._send("start_repair", node_id=node_id, action=action.value, attempt=attempt)

    def start_workers(self, gang: Gang) -> None:
        self._send("start_workers", **gang_args(gang))

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """The gate's checks (shared.service_layer.deep_checks), run by the executor's adapter."""
        self._send("start_deep_check", node_id=node_id, attempt=attempt)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        self._send("signal_workers", job_id=job_id, attempt=attempt, grace_s=grace_s)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self._send("stop_workers", job_id=job_id, attempt=attempt)
