"""mtc's extension: an operator's commands on a node, as custom methods.

``POST v1beta1/{cluster}/nodes/{node}:releaseHold | :drain | :resume | :returnToService``
with ``{"reason": "..."}`` (permission ``aiplatform.modelDevelopmentClusters.update``):
``services.repair.operator`` applies them; the HTTP layer writes the audit record (who,
what, reason, when) and the command emits ``NodeOperatorActed`` for the timeline. The answer
is the node as ``GET .../nodes`` lists it.
"""

from __future__ import annotations

from typing import Any

from services.api import ids
from services.api.clusters import COLLECTION, KIND, node_view
from services.api.context import ApiContext, load_record
from services.api.names import Parent
from services.api.wire.cluster import NodeOperatorRequest
from services.api.wiremodel import parse_message
from services.repair import operator

VERBS = (operator.RELEASE_HOLD, operator.DRAIN, operator.RESUME, operator.RETURN)


def act(ctx: ApiContext, parent: Parent, cluster_id: str, node_id: str, verb: str, body: Any,
        principal: str) -> dict[str, Any]:
    message = parse_message(NodeOperatorRequest, body)
    with ctx.unit() as uow:
        record = load_record(uow, KIND, cluster_id, parent,
                             parent.child(COLLECTION, cluster_id))
        domain_id = ids.domain_of(record)
        node = operator.act(verb, domain_id, ids.domain_node(domain_id, cluster_id, node_id),
                            message.reason, principal, uow, ctx.runtime.deps)
        return node_view(parent, cluster_id, node).to_json()
