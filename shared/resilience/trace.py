"""A scripted fault trace: versioned data the recovery benchmark plays, live and in the twin.

.. code-block:: yaml

    version: 1
    name: one-of-each
    cluster: {nodes: 4, spares: 1, repair: 5s}
    job: {replicas: 4, min_replicas: 3, step_time: 0.05, checkpoint_every: 20, tier1_every: 5}
    faults:
      - {kind: app_crash, at: 4, target: {rank: 1}}
      - {kind: xid_79, after_step: 300, target: {node: bench-h100-2}}

A fault happens ``at`` seconds (a number, or ``"90s"``, ``"2m"``) after the job's first
attempt started, or once the job reached step ``after_step``; never before the job has
resumed from the fault before it. Its target is the node running a ``rank`` of the job, or a
``node`` by id (live runs only). Kinds (:class:`FaultKind`): the incident each stands for is
in :data:`INCIDENT_OF` (the recovery policy's incident kinds). Errors name the field
(``faults[2].target.rank``) and nothing is half-read.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from shared import yaml_text
from shared.domain import validation as kit
from shared.domain.errors import ValidationError

VERSION = 1
DEFAULT_TRACE = "default"  # the packaged trace `mtc bench recovery` plays without --trace


class FaultKind(enum.StrEnum):
    APP_CRASH = "app_crash"  # SIGKILL of one rank's program; the node is sound
    XID_13 = "xid_13"  # a graphics engine exception: the triage table restarts the app
    XID_79 = "xid_79"  # the GPU fell off the bus: the node needs a repair (reboot)
    NODE_LOST = "node_lost"  # the node is gone, with its memory (no heartbeat, ranks dead)
    NO_SPARE_ELASTIC = "no_spare_elastic"  # an XID 79 while no spare is ready: elastic job


# the recovery policy's incident kind for each fault (shared.policies.recovery.IncidentKind)
INCIDENT_OF: Mapping[FaultKind, str] = {
    FaultKind.APP_CRASH: "app_restart",
    FaultKind.XID_13: "app_restart",
    FaultKind.XID_79: "node_repair",
    FaultKind.NODE_LOST: "node_lost",
    FaultKind.NO_SPARE_ELASTIC: "node_repair",
}


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at_s: float | None  # seconds after the job's first start
    after_step: int | None  # or: once the job reached this step
    rank: int | None  # the node running this rank of the job
    node: str | None  # or this node, by id (live only)

    @property
    def when(self) -> str:
        return f"t+{self.at_s:g}s" if self.at_s is not None else f"step {self.after_step}"

    @property
    def target(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"node {self.node}"


@dataclass(frozen=True)
class JobShape:
    replicas: int
    min_replicas: int | None
    step_time_s: float
    checkpoint_every: int
    steps: int
    tier1_every: int | None = None  # memory (and peer) saves, in steps; None: the program's


@dataclass(frozen=True)
class Trace:
    version: int
    name: str
    description: str
    nodes: int  # worker nodes of the cluster
    spares: int  # hot spares beside them
    repair_s: float  # how long a node's repair (a reboot) takes
    job: JobShape
    faults: tuple[Fault, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "name": self.name, "nodes": self.nodes,
                "spares": self.spares, "repair_s": self.repair_s, "job": vars(self.job),
                "faults": [{"kind": f.kind.value, "when": f.when, "target": f.target}
                           for f in self.faults]}


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(value: Any, path: str) -> float:
    """A non-negative number of seconds, or a string like ``"90s"``, ``"2m"``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValidationError(path, f"must be seconds or a duration like '90s', got {value!r}")
        return float(match.group(1)) * _UNITS[match.group(2) or "s"]
    return kit.number(value, path, low=0.0)


def parse_trace(data: Any) -> Trace:
    """Validate a parsed trace document; a ValidationError names the first bad field."""
    top = kit.mapping(data, "trace")
    kit.only_keys(top, "", ("version", "name", "description", "cluster", "job", "faults"))
    version = kit.integer(kit.required(top, "version", ""), "version")
    if version != VERSION:
        raise ValidationError("version", f"must be {VERSION} (the only version this mtc reads), "
                              f"got {version}")
    name = kit.text(kit.get(top, "name", "trace"), "name")
    description = str(kit.get(top, "description", "")).strip()
    cluster = kit.mapping(kit.get(top, "cluster", {}), "cluster")
    kit.only_keys(cluster, "cluster", ("nodes", "spares", "repair"))
    nodes = kit.integer(kit.get(cluster, "nodes", 4), "cluster.nodes", low=1, high=64)
    spares = kit.integer(kit.get(cluster, "spares", 1), "cluster.spares", low=0, high=16)
    repair = seconds(kit.get(cluster, "repair", 5.0), "cluster.repair")
    job = _job(kit.mapping(kit.required(top, "job", ""), "job"), nodes)
    raw = kit.required(top, "faults", "")
    if not isinstance(raw, list) or not raw:
        raise ValidationError("faults", "must be a non-empty list of faults")
    faults = tuple(_fault(item, kit.join("faults", i), job) for i, item in enumerate(raw))
    return Trace(version, name, description, nodes, spares, repair, job, faults)


def _job(data: Mapping[str, Any], nodes: int) -> JobShape:
    kit.only_keys(data, "job", ("replicas", "min_replicas", "step_time", "checkpoint_every",
                                "tier1_every", "steps"))
    replicas = kit.integer(kit.get(data, "replicas", nodes), "job.replicas", low=1, high=nodes)
    low = data.get("min_replicas")
    min_replicas = None if low is None else kit.integer(low, "job.min_replicas", low=1,
                                                        high=replicas)
    step = seconds(kit.get(data, "step_time", 0.05), "job.step_time")
    if step <= 0:
        raise ValidationError("job.step_time", "must be positive")
    every = kit.integer(kit.get(data, "checkpoint_every", 20), "job.checkpoint_every", low=1)
    steps = kit.integer(kit.get(data, "steps", 100000), "job.steps", low=1)
    raw1 = data.get("tier1_every")
    tier1 = None if raw1 is None else kit.integer(raw1, "job.tier1_every", low=1, high=every)
    return JobShape(replicas, min_replicas, step, every, steps, tier1)


def _fault(item: Any, path: str, job: JobShape) -> Fault:
    data = kit.mapping(item, path)
    kit.only_keys(data, path, ("kind", "at", "after_step", "target"))
    raw_kind = kit.text(kit.required(data, "kind", path), kit.join(path, "kind"))
    try:
        kind = FaultKind(raw_kind)
    except ValueError:
        raise ValidationError(kit.join(path, "kind"), f"must be one of "
                              f"{', '.join(k.value for k in FaultKind)}, got {raw_kind!r}") from None
    if ("at" in data) == ("after_step" in data):
        raise ValidationError(kit.join(path, "at"), "give exactly one of at (seconds after the "
                              "job's start) and after_step")
    at = seconds(data["at"], kit.join(path, "at")) if "at" in data else None
    after = kit.integer(data["after_step"], kit.join(path, "after_step"), low=0) \
        if "after_step" in data else None
    tpath = kit.join(path, "target")
    target = kit.mapping(kit.required(data, "target", path), tpath)
    kit.only_keys(target, tpath, ("rank", "node"))
    if ("rank" in target) == ("node" in target):
        raise ValidationError(kit.join(tpath, "rank"), "give exactly one of rank and node")
    rank = kit.integer(target["rank"], kit.join(tpath, "rank"), low=0, high=job.replicas - 1) \
        if "rank" in target else None
    node = kit.text(target["node"], kit.join(tpath, "node")) if "node" in target else None
    if kind is FaultKind.NO_SPARE_ELASTIC and job.min_replicas is None:
        raise ValidationError(kit.join(path, "kind"), "no_spare_elastic needs an elastic job "
                              "(job.min_replicas)")
    return Fault(kind, at, after, rank, node)


def load_trace(source: str | Path | None = None) -> Trace:
    """A trace file, or a packaged one by name (``default``, ``two-faults``, ``node-faults``;
    None: default)."""
    name = str(source) if source is not None else DEFAULT_TRACE
    packaged = resources.files("shared.resilience") / "data" / f"{name}.yaml"
    path = Path(name)
    if not path.is_file() and packaged.is_file():
        text = packaged.read_text(encoding="utf-8")
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValidationError("--trace", f"cannot read {name}: {exc.strerror or exc}; "
                                  f"packaged traces: {', '.join(packaged_traces())}") from None
    try:
        data = yaml_text.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValidationError("--trace", f"{name} is not valid YAML: {exc}") from None
    return parse_trace(data)


def packaged_traces() -> list[str]:
    folder = resources.files("shared.resilience") / "data"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                  if p.name.endswith(".yaml"))
