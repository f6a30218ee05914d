"""What only a person can decide about a node, as commands: release a hold, drain, resume,
return a FAILED node. The API (``services.api.node_ops``), the CLI (local and ``--api``) and
scripts (the soak) call these in one unit of work; each applied command emits
``NodeOperatorActed`` (who, what, reason, when) for the timeline, beside the API's audit log.

Bad input changes nothing: an unknown node or one of another cluster is NotFound, a missing
reason a ValidationError naming ``reason``, a command the node's state does not allow a
Conflict (FAILED_PRECONDITION). A repeat of the command last applied to the node (the same
verb and reason: a retry, a redelivery) answers the node as it is and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from services.repair import handlers as repair
from shared.domain import lifecycle
from shared.domain.errors import Conflict, NotFound, ValidationError
from shared.domain.events import NodeOperatorActed
from shared.domain.model import Node, NodeRole, NodeState
from shared.handling import Deps
from shared.ports import UnitOfWork
from shared.service_layer import returns

MAX_REASON = 512
RELEASE_HOLD, DRAIN, RESUME, RETURN = "releaseHold", "drain", "resume", "returnToService"


def node_of(cluster_id: str, node_id: str, uow: UnitOfWork) -> Node:
    node = uow.nodes.get(node_id)
    if node is None or node.cluster_id != cluster_id or node.state is NodeState.RETIRED:
        raise NotFound("node", f"{node_id} of cluster {cluster_id}")
    return node


def check_reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise ValidationError("reason", "is required: say why (it goes in the audit record)")
    if len(reason) > MAX_REASON:
        raise ValidationError("reason", f"at most {MAX_REASON} characters")
    return reason.strip()


def _release_hold(node: Node, text: str, uow: UnitOfWork, deps: Deps) -> str | None:
    if node.state is not NodeState.SUSPECT:
        return f"is {node.state.value}, not held by the blast-radius guard"
    repair.release_held(node, uow, deps, text)
    return None


def _drain(node: Node, text: str, uow: UnitOfWork, deps: Deps) -> str | None:
    if lifecycle.operator_drained(node):
        return "is already drained by an operator"
    repair.operator_drain(node, uow, deps, text)
    return None


def _resume(node: Node, text: str, uow: UnitOfWork, deps: Deps) -> str | None:
    if not lifecycle.operator_drained(node):
        return "was not drained by an operator: nothing to resume"
    if node.state is NodeState.DRAINING:
        return "is still draining (its job is checkpointing): resume it once it is drained"
    returns.resume(node, uow, deps, text)
    return None


def _return(node: Node, text: str, uow: UnitOfWork, deps: Deps) -> str | None:
    if node.state is not NodeState.FAILED:
        return f"is {node.state.value}, not FAILED: only a failed node is returned"
    if lifecycle.operator_drained(node):
        return "is drained by an operator: resume it first"
    lifecycle.return_failed(node, deps.clock.now(), text)
    return None


COMMANDS: dict[str, Callable[[Node, str, UnitOfWork, Deps], str | None]] = {
    RELEASE_HOLD: _release_hold, DRAIN: _drain, RESUME: _resume, RETURN: _return,
}


def act(verb: str, cluster_id: str, node_id: str, reason: object, by: str,
        uow: UnitOfWork, deps: Deps) -> Node:
    """Apply one operator command to a node; returns the node as it is afterwards."""
    text = check_reason(reason)
    node = node_of(cluster_id, node_id, uow)
    if node.role is not NodeRole.WORKER:
        raise Conflict(f"node {node_id} is the login node: it runs no jobs")
    request = f"{verb}:{text}"
    if verb == RELEASE_HOLD and repair.host_reported(node):
        request = f"{repair.HOST_REPORT}:{request}"  # released, it is still a host report
    refused = COMMANDS[verb](node, f"{verb} by {by}: {text}", uow, deps)
    if refused is not None:
        if node.operator_request == request:
            return node  # the same command again (a retry): already applied
        raise Conflict(f"node {node_id} {refused}")
    node.operator_request = request
    uow.emit(NodeOperatorActed(node_id=node_id, cluster_id=cluster_id, action=verb,
                               reason=text, by=by, at=deps.clock.now()))
    return node
