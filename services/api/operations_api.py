"""The operations collection: get, list, wait, cancel, delete (google.longrunning)."""

from __future__ import annotations

import functools
import time
from typing import Any

from services.api import clusters
from services.api import operations as ops
from services.api.context import ApiContext
from services.api.names import Parent
from services.api.paging import matches, page_size, paginate, parse_filter
from services.api.wire.operation import ListOperationsResponse, Operation, WaitOperationRequest
from services.api.wiremodel import parse_message
from services.job_submission import commands as job_commands

DEFAULT_WAIT_S = 30.0


def _render(ctx: ApiContext, uow: Any, parent: Parent, record: dict[str, Any]) -> dict[str, Any]:
    def cluster_json(cluster: Any) -> dict[str, Any]:
        rec = uow.record("api_resources", f"cluster:{cluster.cluster_id}")
        return clusters.render(uow, cluster, parent, rec) if rec else {}

    return Operation.model_validate(ops.render(uow, record, ctx.now, cluster_json)).to_json()


def get(ctx: ApiContext, parent: Parent, op_id: str) -> dict[str, Any]:
    ctx.refresh()
    with ctx.unit() as uow:
        return _render(ctx, uow, parent, ops.load(uow, parent, op_id))


def list_operations(ctx: ApiContext, parent: Parent, *, size: str | None = None,
                    token: str | None = None, filter_text: str | None = None
                    ) -> dict[str, Any]:
    terms = parse_filter(filter_text, ("done",))
    limit = page_size(size)
    ctx.refresh()
    with ctx.unit() as uow:
        rendered = [_render(ctx, uow, parent, r) for r in ops.listed(uow, parent)]
    rendered = [o for o in rendered if matches(terms, functools.partial(_done_field, o))]
    page = paginate(rendered, size=limit, token=token, filter_text=filter_text or "")
    return ListOperationsResponse(operations=[Operation.model_validate(o) for o in page.items],
                                  next_page_token=page.next_page_token).to_json()


def wait(ctx: ApiContext, parent: Parent, op_id: str, body: Any) -> dict[str, Any]:
    """Returns when the operation is done or the timeout (default 30 s) passes, whichever is
    first; the control plane keeps moving meanwhile (``refresh``)."""
    request = parse_message(WaitOperationRequest, body)
    timeout = request.timeout if request.timeout is not None else DEFAULT_WAIT_S
    deadline = time.monotonic() + min(timeout, ctx.max_wait_s)
    while True:
        current = get(ctx, parent, op_id)
        if current["done"] or time.monotonic() >= deadline:
            return current
        ctx.sleep(0.05)


def cancel(ctx: ApiContext, parent: Parent, op_id: str) -> dict[str, Any]:
    with ctx.unit() as uow:
        record = ops.load(uow, parent, op_id)
        ops.cancel(uow, record, ctx.now,
                   lambda cid: job_commands.delete_cluster(cid, uow, ctx.runtime.deps))
    return {}


def delete(ctx: ApiContext, parent: Parent, op_id: str) -> dict[str, Any]:
    with ctx.unit() as uow:
        ops.delete(uow, ops.load(uow, parent, op_id))
    return {}


def _done_field(operation: dict[str, Any], name: str) -> str:
    return str(operation.get(name, False)).lower()
