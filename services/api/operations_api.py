"""The operations collection: get, list, wait, cancel, delete (google.longrunning)."""

from __future__ import annotations

import time
from typing import Any

from services.api import clusters
from services.api import operations as ops
from services.api.collection import Collection, Scope
from services.api.context import ApiContext
from services.api.names import Parent
from services.api.wire.operation import ListOperationsResponse, Operation, WaitOperationRequest
from services.api.wiremodel import parse_message
from services.job_submission import commands as job_commands

DEFAULT_WAIT_S = 30.0


def _render(scope: Scope, record: dict[str, Any]) -> dict[str, Any]:
    uow, parent = scope.uow, scope.parent

    def cluster_json(cluster: Any) -> dict[str, Any]:
        rec = uow.record("api_resources", f"cluster:{cluster.cluster_id}")
        return clusters.render(uow, cluster, parent, rec) if rec else {}

    return Operation.model_validate(ops.render(uow, record, scope.ctx.now, cluster_json)
                                    ).to_json()


def wait(ctx: ApiContext, parent: Parent, op_id: str, body: Any) -> dict[str, Any]:
    """Returns when the operation is done or the timeout (default 30 s) passes, whichever is
    first; the control plane keeps moving meanwhile (``refresh``)."""
    request = parse_message(WaitOperationRequest, body)
    timeout = request.timeout if request.timeout is not None else DEFAULT_WAIT_S
    deadline = time.monotonic() + min(timeout, ctx.max_wait_s)
    slot = ctx.wait_slots
    if slot is not None and not slot.acquire(blocking=False):
        return get(ctx, parent, op_id)  # every waiting slot is taken: answer now
    try:
        while True:
            current = get(ctx, parent, op_id)
            if current["done"] or time.monotonic() >= deadline:
                return current
            ctx.sleep(0.05)
    finally:
        if slot is not None:
            slot.release()


def _cancel(scope: Scope, op_id: str, record: dict[str, Any]) -> None:
    uow, deps = scope.uow, scope.ctx.runtime.deps
    ops.cancel(uow, record, scope.ctx.now, lambda cid: job_commands.delete_cluster(cid, uow, deps))


def delete(ctx: ApiContext, parent: Parent, op_id: str) -> dict[str, Any]:
    with ctx.unit() as uow:
        ops.delete(uow, ops.load(uow, parent, op_id))
    return {}


def _done_field(operation: dict[str, Any], name: str) -> str:
    """``done`` as a filter compares it: ``true`` or ``false``."""
    return str(operation.get(name, False)).lower()


OPERATIONS: Collection[dict[str, Any]] = Collection(
    ListOperationsResponse, "operations", Operation,
    load=lambda scope: ops.listed(scope.uow, scope.parent), render=_render,
    filterable=("done",), field=_done_field,
    find=lambda scope, op_id: ops.load(scope.uow, scope.parent, op_id), stop=_cancel,
    remove=delete)
get, list_operations, cancel = OPERATIONS.get, OPERATIONS.list_page, OPERATIONS.cancel
