"""mtc's extension: a cluster's candidate triage table, in shadow, recommend-only or active.

``GET v1beta1/{cluster}/triagePolicy`` answers the rollout, its diff report by cause and its
recommendations (``aiplatform.modelDevelopmentClusters.get``);
``POST .../triagePolicy:configure`` sets the candidate and its stages,
``POST .../triagePolicy:accept`` / ``:dismiss`` decide a recommendation and
``POST .../triagePolicy:clear`` removes the candidate (``...update``; each with a
``reason``, which the HTTP layer writes in the audit record). The state and its rules are
``shared.service_layer.triage_policy``'s.
"""

from __future__ import annotations

from typing import Any

from services.api import ids
from services.api.clusters import COLLECTION, KIND
from services.api.context import ApiContext, load_record
from services.api.names import Parent
from services.api.wire.triage_policy import (
    ClearTriagePolicyRequest,
    ConfigureTriagePolicyRequest,
    DecideRecommendationRequest,
)
from services.api.wiremodel import parse_message
from shared.service_layer import triage_policy

ACCEPT, DISMISS = triage_policy.ACCEPT, triage_policy.DISMISS
CONFIGURE, CLEAR = "configure", "clear"
VERBS = (CONFIGURE, ACCEPT, DISMISS, CLEAR)


def _cluster(uow: Any, parent: Parent, cluster_id: str) -> str:
    record = load_record(uow, KIND, cluster_id, parent, parent.child(COLLECTION, cluster_id))
    return ids.domain_of(record)


def get(ctx: ApiContext, parent: Parent, cluster_id: str) -> dict[str, Any]:
    ctx.refresh()
    with ctx.unit() as uow:
        return triage_policy.view(uow, _cluster(uow, parent, cluster_id))


def act(ctx: ApiContext, parent: Parent, cluster_id: str, verb: str, body: Any,
        principal: str) -> dict[str, Any]:
    rollout: dict[str, Any] = {}
    if verb == CONFIGURE:  # camelCase, whichever case the caller wrote
        rollout = parse_message(ConfigureTriagePolicyRequest, body).to_json()
        rollout.pop("reason", None)
    elif verb == CLEAR:
        parse_message(ClearTriagePolicyRequest, body)
    else:
        message = parse_message(DecideRecommendationRequest, body)
    with ctx.unit() as uow:
        domain_id = _cluster(uow, parent, cluster_id)
        if verb == CONFIGURE:
            triage_policy.configure(uow, domain_id, rollout, principal, ctx.now)
        elif verb == CLEAR:
            triage_policy.clear(uow, domain_id)
        else:
            triage_policy.decide(uow, ctx.runtime.deps, domain_id, message.recommendation,
                                 verb, message.reason, principal)
        return triage_policy.view(uow, domain_id)
