"""Scenario overrides: what ``--set key=value`` and a sweep's axes change in a scenario
before it is parsed.

A key is a dotted path into the scenario (``*`` = every item of a list, a number = one item)
or one of the short names below for what people vary most; a value is a YAML scalar, and
``a+b+c`` is a list (commas separate a sweep's values).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from shared import yaml_text
from simulator.readers import DURATION_RE, ScenarioError

# Short names for what people vary most; any dotted path works too (``*`` = every list item).
ALIASES: dict[str, tuple[str, ...]] = {
    "checkpoint_interval": ("jobs.*.checkpoint_interval",),
    "checkpoint_save": ("jobs.*.checkpoint_save",),
    "checkpoint_restore": ("jobs.*.checkpoint_restore",),
    "startup": ("jobs.*.startup",),
    "spares": ("cluster.partitions.*.spares",),
    "nodes_per_rack": ("cluster.partitions.*.nodes_per_rack",),
    "spare_layout": ("cluster.partitions.*.spare_layout",),
    "nodes": ("cluster.partitions.*.nodes", "jobs.*.nodes"),
    "failure_scale": ("failures.rate_scale",),
    "lemon_fraction": ("failures.lemons.fraction",),
    "duration": ("duration",),
    "ladder": ("control_plane.repair.ladder",),
    "bus_latency": ("bus.latency",),
    "duplicate": ("bus.duplicate",),
    "seed": ("seed",),
    "availability_mode": ("availability.mode",),
    "price": ("availability.price_per_node_hour",),
    "preemption_rate": ("availability.spot.preemptions_per_node_day",),
}


def parse_value(text_: str) -> Any:
    """A command-line value: YAML scalar; ``a+b+c`` is a list (commas separate sweep values)."""
    if "+" in text_ and not DURATION_RE.match(text_):
        return [parse_value(part) for part in text_.split("+")]
    try:
        return yaml_text.safe_load(text_)
    except yaml.YAMLError:
        return text_


def apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    for path in ALIASES.get(key, (key,)):
        _set_path(raw, path.split("."), value, key)


def _set_path(node: Any, parts: list[str], value: Any, key: str) -> None:
    head, rest = parts[0], parts[1:]
    if head == "*":
        if not isinstance(node, list):
            raise ScenarioError(key, "'*' used where the scenario has no list")
        for item in node:
            _set_path(item, rest, value, key)
        return
    if isinstance(node, list):
        if not head.isdigit() or int(head) >= len(node):
            raise ScenarioError(key, f"no list item {head!r}")
        target: Any = node
        index: Any = int(head)
    elif isinstance(node, dict):
        target, index = node, head
    else:
        raise ScenarioError(key, f"cannot set {head!r} inside a {type(node).__name__}")
    if not rest:
        target[index] = copy.deepcopy(value)
        return
    if isinstance(target, dict) and target.get(index) is None:
        target[index] = [] if rest[0] == "*" or rest[0].isdigit() else {}
    _set_path(target[index], rest, value, key)
