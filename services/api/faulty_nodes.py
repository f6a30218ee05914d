"""``POST v1beta1/{cluster}:reportFaultyNodes``, as the managed training clusters define it.

``{"nodeActions": [{"nodeId": ...}]}`` deletes a node (recreated with the same name and
spec); ``{"nodeActions": [{"nodeId": ..., "reportFaultyHost": {"faultReasons": [...]}}]}``
reports its host (the node goes REPAIRING and returns on a repaired or new host). Google's
service takes one node a call; mtc takes several, each through ``services.repair.faulty``
(the jobs' recovery policy, the blast-radius guard) in one unit of work. The answer is an
Operation, done once no reported node is on its way. Permission:
``aiplatform.modelDevelopmentClusters.reportFaultyNodes``; the HTTP layer writes the audit
record, the command emits ``NodeOperatorActed`` per node for the timeline.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from services.api import ids
from services.api import operations as ops
from services.api.clusters import COLLECTION, KIND
from services.api.context import ApiContext, load_record
from services.api.errors import invalid
from services.api.names import Parent
from services.api.wire.cluster import ReportFaultyNodesRequest
from services.api.wiremodel import parse_message
from services.repair import faulty

VERB = "reportFaultyNodes"


def _actions(message: ReportFaultyNodesRequest) -> list[faulty.NodeAction]:
    out, seen = [], set()
    for i, action in enumerate(message.node_actions):
        if action.node_id in seen:
            raise invalid(f"nodeActions[{i}].nodeId", f"{action.node_id} is named twice")
        seen.add(action.node_id)
        host = action.report_faulty_host
        out.append(faulty.NodeAction(action.node_id, None if host is None else tuple(
            faulty.FaultReason(r.behavior, r.description) for r in host.fault_reasons)))
    return out


def report(ctx: ApiContext, parent: Parent, cluster_id: str, body: Any,
           principal: str) -> dict[str, Any]:
    message = parse_message(ReportFaultyNodesRequest, body)
    actions = _actions(message)
    with ctx.unit() as uow:
        record = load_record(uow, KIND, cluster_id, parent,
                             parent.child(COLLECTION, cluster_id))
        domain_id = ids.domain_of(record)
        actions = [dataclasses.replace(a, node_id=ids.domain_node(domain_id, cluster_id,
                                                                   a.node_id))
                   for a in actions]
        faulty.report(actions, domain_id, principal, uow, ctx.runtime.deps)
        # the same request again (a retry) answers the same Operation
        request = json.dumps(message.to_json(), sort_keys=True)
        op = ops.start(uow, parent, target=ops.NODES_TARGET, target_id=domain_id, verb=VERB,
                       generation=int(ops.operation_id(request)), now=ctx.now,
                       retention_s=ctx.runtime.deps.config.retention_s,
                       nodes=[ids.api_node(domain_id, cluster_id, a.node_id)
                              for a in actions])
        return ops.render(uow, op, ctx.now)
