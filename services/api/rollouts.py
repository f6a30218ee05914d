"""mtc's extension: a software rollout on a cluster, as a custom method.

``POST v1beta1/{cluster}:rolloutSoftware`` with ``{"version": {"nodeImage": ..., "driver":
..., "agent": ...}, "waveSize": N, "canary": N}`` (permission
``aiplatform.modelDevelopmentClusters.update``) plans and starts the rollout
(``services.repair.rollout``) and answers an Operation whose ``metadata.mtcRollout`` shows
the waves, the wave under way and the state; ``GET`` of the operation shows its progress. It
finishes when every node runs the new version (its response: the cluster), or when a
regression rolled it back (its error: ABORTED, naming the regression). The same request again
while it runs answers the same Operation; another version while one runs is
FAILED_PRECONDITION.
"""

from __future__ import annotations

from typing import Any

from services.api import ids
from services.api import operations as ops
from services.api.clusters import COLLECTION, KIND, _renderer
from services.api.context import ApiContext, load_record
from services.api.errors import invalid
from services.api.names import Parent
from services.repair import rollout

VERB = ops.ROLLOUT_VERB


def start(ctx: ApiContext, parent: Parent, cluster_id: str, body: Any,
          principal: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    with ctx.unit() as uow:
        record = load_record(uow, KIND, cluster_id, parent,
                             parent.child(COLLECTION, cluster_id))
        domain_id = ids.domain_of(record)
        started = rollout.start(domain_id, body, principal, uow, ctx.runtime.deps)
        op = ops.start(uow, parent, target=ops.ROLLOUT_TARGET, target_id=domain_id, verb=VERB,
                       generation=int(started["seq"]), now=ctx.now,
                       retention_s=ctx.runtime.deps.config.retention_s,
                       rollout=(started["id"], cluster_id))
        return ops.render(uow, op, ctx.now, _renderer(uow, parent))
