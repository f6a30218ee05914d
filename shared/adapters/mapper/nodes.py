"""The node mapper's codec: the document ``Node.to_dict`` writes and ``Node.from_dict`` reads,
built without the generic loop. A node is decoded and encoded several times per event (a
report, a drain, a restart's reads), millions of times in a simulated run, so its document is
built from the entity's fields at once, and a document in exactly the encoded shape is
decoded by filling the fields in one update; any other shape takes ``Node.from_dict``.

Conditions and the history's records are immutable: a store that keeps the values written
(the memory store) gives the same :class:`NodeCondition` objects back, which are shared, not
rebuilt; a store that goes through JSON gives lists, which are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared.domain.health import FailureRecord, RepairAction
from shared.domain.model import (
    NODE_FIELDS,
    Node,
    NodeCondition,
    NodeRole,
    NodeState,
    conditions_from,
    sound_for,
)

# value -> member without the Enum call
_STATES = dict(NodeState._value2member_map_)
_ROLES = dict(NodeRole._value2member_map_)
_ACTIONS = dict(RepairAction._value2member_map_)
_ENCODED = NODE_FIELDS | {"sound", "sound_for"}  # the keys of a node's document
_new = object.__new__


def dump(node: Node) -> dict[str, Any]:
    """``node.to_dict()``: the fields as they are (plain values, or immutable ones), then the
    few stored in another form."""
    doc = dict(node.__dict__)
    doc["role"] = node.role.value
    doc["state"] = node.state.value
    action = node.repair_action
    doc["repair_action"] = action.value if action else None
    doc["history"] = [[r.at, r.failure_mode, r.action.value] for r in node.history]
    doc["conditions"] = dict(node.conditions)
    sound = node.sound
    doc["sound"] = sound
    doc["sound_for"] = node.job_id if sound and node.state is NodeState.ALLOCATED else None
    return doc


def load(doc: dict[str, Any]) -> Node:
    """``Node.from_dict(doc)``."""
    if doc.keys() != _ENCODED:  # an older, partial or newer document
        return Node.from_dict(doc)
    node: Node = _new(Node)
    state = node.__dict__
    state.update(doc)
    del state["sound"], state["sound_for"]
    state["role"] = _ROLES[state["role"]]
    state["state"] = _STATES[state["state"]]
    action = state["repair_action"]
    state["repair_action"] = _ACTIONS[action] if action else None
    history = state["history"]
    state["history"] = [FailureRecord(h[0], h[1], _ACTIONS[h[2]]) for h in history] \
        if history else []
    state["conditions"] = _conditions(state["conditions"])
    return node


def _conditions(raw: dict[str, Any]) -> dict[str, NodeCondition]:
    """The conditions as stored: shared when the store kept the values written (the first
    one tells: a document's are all written by ``dump`` or all read from JSON)."""
    if type(next(iter(raw.values()), None)) is NodeCondition:
        return dict(raw)
    return conditions_from(raw)


def value(node: Node, name: str) -> Any:
    """``dump(node)[name]`` (None for a field it lacks) without encoding the rest: a query
    within a unit of work checks the nodes it holds field by field (a cluster's creation
    holds 2,081)."""
    encode = _ENCODINGS.get(name)
    return encode(node) if encode is not None else node.__dict__.get(name)


# the document fields stored in another form than the attribute's own
_ENCODINGS: dict[str, Callable[[Node], Any]] = {
    "role": lambda n: n.role.value,
    "state": lambda n: n.state.value,
    "repair_action": lambda n: n.repair_action.value if n.repair_action else None,
    "sound": lambda n: n.sound,
    "sound_for": sound_for,
    "history": lambda n: dump(n)["history"],
    "conditions": lambda n: dict(n.conditions),
}
