"""Compute requests on the wire: what ``RemoteCompute`` publishes and the executor applies.

One ``Compute`` call is one message on ``mtc-compute-requests``: JSON data ``{"op", "args"}``
and attributes naming the request (``mtc-request-id``), the operation, when it was issued and
its deadline. The ordering key is the node id (the job id for worker calls), so what is asked
of one node is applied in the order it was asked.

Request ids are deterministic, derived from the call's idempotency key (the port's: provision
and delete by node, a repair by node and attempt whatever the action, worker calls by job and
attempt, a start by its placement too), so a handler that runs again after a crash asks for
the same request and the executor applies it once. A start is published before its
transaction commits (a failed publish aborts it); the executor applies it only once the store
shows that attempt placed on those nodes (``services.executor.placements``). Cordon and
uncordon set a state that can legitimately be asked for again later (cordon, uncordon,
cordon), so their key includes the time they were issued and
the caller's call counter: each is its own request, and applying one twice (a handler that
ran again) changes nothing anyway.

``start_workers`` carries the attempt as one gang (``{"gang": {...}}``: the node per rank and
one command and environment per worker pool), so a 2,048-rank restart is a few tens of KB, not
2,048 copies of the command and env against Pub/Sub's 10 MB limit. The per-rank form of
earlier control planes (``{"workers": [...]}``) is still applied, as the same gang, so
executors can be upgraded first; both forms of one attempt have the same request id.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from shared.domain import validation as kit
from shared.domain.errors import ValidationError
from shared.domain.health import RepairAction
from shared.domain.model import Node
from shared.ports import Compute, DeepChecks, Gang, LaunchGroup, RecoveryPlan, WorkerSpec

TOPIC = "compute-requests"  # the topic is ``<prefix>compute-requests``
SCHEMA = "mtc.compute.request.v1"
DEFAULT_TTL_S = 300.0  # a request not applied within this long is refused, not applied late
OPS = ("provision_node", "cordon", "uncordon", "delete_node", "start_repair",
       "start_workers", "signal_workers", "stop_workers", "start_deep_check")
ATTR_ID, ATTR_OP = "mtc-request-id", "mtc-op"
ATTR_ISSUED, ATTR_DEADLINE, ATTR_SCHEMA = "mtc-issued-at", "mtc-deadline", "mtc-schema"


def topic_id(prefix: str = "mtc-") -> str:
    return f"{prefix}{TOPIC}"


@dataclass(frozen=True)
class ComputeRequest:
    """One Compute call, addressed to the executor."""

    op: str
    args: Mapping[str, Any]
    request_id: str
    ordering_key: str
    issued_at: float
    deadline: float

    def expired(self, now: float) -> bool:
        return now > self.deadline


def request_id(op: str, key: str) -> str:
    return hashlib.sha256(f"{op}:{key}".encode()).hexdigest()[:32]


def _key(op: str, args: Mapping[str, Any], issued_at: float) -> tuple[str, str]:
    """(idempotency key, ordering key) of a call."""
    if op == "provision_node":
        node_id = str(args["node"]["node_id"])
        return node_id, node_id
    if op in ("cordon", "uncordon"):
        node_id = str(args["node_id"])
        return f"{node_id}|{args.get('reason', '')}|{issued_at!r}|{args.get('seq', 0)}", node_id
    if op == "delete_node":
        return str(args["node_id"]), str(args["node_id"])
    if op in ("start_repair", "start_deep_check"):  # the op is part of the request id
        return f"{args['node_id']}|{args['attempt']}", str(args["node_id"])
    if op == "start_workers":  # the gang, or the first of the per-rank form's workers
        first = args["gang"] if "gang" in args else args["workers"][0]
        return (f"{first['job_id']}|{first['attempt']}|{placement_tag(start_nodes(args))}",
                str(first["job_id"]))
    return f"{args['job_id']}|{args['attempt']}", str(args["job_id"])


def start_nodes(args: Mapping[str, Any]) -> tuple[str, ...]:
    """The node of each rank of a ``start_workers``, in either form."""
    if "gang" in args:
        return tuple(str(n) for n in args["gang"]["node_ids"])
    return tuple(str(w["node_id"]) for w in sorted(args["workers"], key=lambda w: w["rank"]))


def placement_tag(node_ids: tuple[str, ...]) -> str:
    """A start's placement in its request id: a placement whose transaction did not commit
    and the one its retry committed are two requests, so the executor can tell them apart
    (it applies the one the store shows: ``services.executor.placements``)."""
    return hashlib.sha256("\n".join(node_ids).encode()).hexdigest()[:12]


def make_request(op: str, args: Mapping[str, Any], issued_at: float, ttl_s: float
                 ) -> ComputeRequest:
    key, ordering = _key(op, args, issued_at)
    return ComputeRequest(op, dict(args), request_id(op, key), ordering, issued_at,
                          issued_at + ttl_s)


def worker_to_dict(spec: WorkerSpec) -> dict[str, Any]:
    """One rank in the per-rank form earlier control planes sent (``gang_of_workers``)."""
    d = spec._asdict()
    d["command"] = list(spec.command)
    d["env"] = [list(pair) for pair in spec.env]
    return d


def worker_from_dict(d: Mapping[str, Any]) -> WorkerSpec:
    try:
        return WorkerSpec(
            job_id=str(d["job_id"]), attempt=int(d["attempt"]), rank=int(d["rank"]),
            world_size=int(d["world_size"]), node_id=str(d["node_id"]),
            command=tuple(str(c) for c in d["command"]),
            env=tuple((str(k), str(v)) for k, v in d["env"]),
            checkpoint_dir=str(d["checkpoint_dir"]), model_dir=str(d["model_dir"]),
            tensorboard_dir=str(d["tensorboard_dir"]),
            buckets=tuple(str(b) for b in d.get("buckets") or ()),
            limits=_limits(d.get("limits")))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValidationError("args.workers", f"not a worker spec: {exc}") from exc


def encode(request: ComputeRequest) -> tuple[bytes, dict[str, str]]:
    """The message body and attributes (the ordering key travels beside them)."""
    data = json.dumps({"op": request.op, "args": request.args}, separators=(",", ":"))
    return data.encode(), {
        ATTR_SCHEMA: SCHEMA, ATTR_ID: request.request_id, ATTR_OP: request.op,
        ATTR_ISSUED: repr(request.issued_at), ATTR_DEADLINE: repr(request.deadline)}


def _float(attributes: Mapping[str, str], name: str) -> float:
    try:
        value = float(attributes[name])
    except (KeyError, ValueError) as exc:
        raise ValidationError(name, "is required (seconds since the epoch)") from exc
    if not math.isfinite(value):
        raise ValidationError(name, "must be finite")
    return value


def decode(data: bytes, attributes: Mapping[str, str], ordering_key: str = ""
           ) -> ComputeRequest:
    """A message back into a request; anything malformed is a ValidationError naming it."""
    if attributes.get(ATTR_SCHEMA) != SCHEMA:
        raise ValidationError(ATTR_SCHEMA, f"must be {SCHEMA}")
    rid = attributes.get(ATTR_ID, "")
    if not rid:
        raise ValidationError(ATTR_ID, "is required")
    try:
        body = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError("data", f"is not JSON: {exc}") from exc
    if not isinstance(body, dict) or body.get("op") not in OPS:
        raise ValidationError("data.op", f"must be one of {', '.join(OPS)}")
    if attributes.get(ATTR_OP) != body["op"]:
        raise ValidationError(ATTR_OP, "does not match data.op")
    if not isinstance(body.get("args"), dict):
        raise ValidationError("data.args", "must be an object")
    return ComputeRequest(body["op"], body["args"], rid, ordering_key,
                          _float(attributes, ATTR_ISSUED), _float(attributes, ATTR_DEADLINE))


def apply(request: ComputeRequest, compute: Compute) -> None:
    """Make the call on a real Compute. Ill-typed arguments are a ValidationError, raised
    before anything is asked of the machines; what the call itself raises is passed on."""
    call = _call(request, compute)
    call()


def _call(request: ComputeRequest, compute: Compute) -> Callable[[], None]:
    a = request.args
    try:
        if request.op == "provision_node":
            node = Node.from_dict(dict(a["node"]))
            return lambda: compute.provision_node(node)
        if request.op == "cordon":
            node_id, reason = str(a["node_id"]), str(a["reason"])
            return lambda: compute.cordon(node_id, reason)
        if request.op == "uncordon":
            node_id = str(a["node_id"])
            return lambda: compute.uncordon(node_id)
        if request.op == "delete_node":
            node_id = str(a["node_id"])
            return lambda: compute.delete_node(node_id)
        if request.op == "start_repair":
            node_id, action, attempt = (str(a["node_id"]), RepairAction(a["action"]),
                                        int(a["attempt"]))
            return lambda: compute.start_repair(node_id, action, attempt)
        if request.op == "start_deep_check":
            node_id, attempt = str(a["node_id"]), int(a["attempt"])
            if not isinstance(compute, DeepChecks):  # refused: the gate stays pending
                raise ValidationError("op", "this executor's compute runs no deep checks")
            checks = compute
            return lambda: checks.start_deep_check(node_id, attempt)
        if request.op == "start_workers":
            gang = gang_of_args(a)
            return lambda: compute.start_workers(gang)
        job_id, attempt = str(a["job_id"]), int(a["attempt"])
        if request.op == "signal_workers":
            grace_s = float(a["grace_s"])
            return lambda: compute.signal_workers(job_id, attempt, grace_s)
        return lambda: compute.stop_workers(job_id, attempt)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValidationError(f"args ({request.op})", f"ill-typed: {exc!r}") from exc


def gang_args(gang: Gang) -> dict[str, Any]:
    """``start_workers``'s arguments: the gang once, its command and env once per pool
    (``recovery`` only when the attempt has a plan: an older executor ignores it)."""
    out: dict[str, Any] = {
        "job_id": gang.job_id, "attempt": gang.attempt, "node_ids": list(gang.node_ids),
        "groups": [{"first_rank": g.first_rank, "count": g.count, "command": list(g.command),
                    "env": [list(pair) for pair in g.env], "limits": list(g.limits)}
                   for g in gang.groups],
        "checkpoint_dir": gang.checkpoint_dir, "model_dir": gang.model_dir,
        "tensorboard_dir": gang.tensorboard_dir}
    if gang.buckets:
        out["buckets"] = list(gang.buckets)
    if gang.recovery is not None:
        out["recovery"] = {"mode": gang.recovery.mode,
                           "fresh_node_ids": list(gang.recovery.fresh_node_ids)}
    return {"gang": out}


def gang_of_args(args: Mapping[str, Any]) -> Gang:
    """The gang of ``start_workers``'s arguments, in either form; a ValidationError names the
    bad field (``args.gang.groups[0].count``)."""
    if "gang" not in args and "workers" in args:
        return gang_of_workers(args["workers"])
    path = "args.gang"
    d = kit.mapping(args.get("gang"), path, noun="an object")
    job_id = cast(str, kit.string(d, "job_id", path))
    attempt = kit.int_field(d, "attempt", path)
    node_ids = kit.field(d, "node_ids", path, list, required=True)
    bad = next((i for i, n in enumerate(node_ids) if not (isinstance(n, str) and n)), None)
    if bad is not None or not node_ids:
        raise ValidationError(f"{path}.node_ids" + ("" if bad is None else f"[{bad}]"),
                              "must be a non-empty list of node ids (non-empty strings)")
    groups = kit.list_field(d, "groups", path, _group)
    ckpt, model, logs = (cast(str, kit.string(d, k, path))
                         for k in ("checkpoint_dir", "model_dir", "tensorboard_dir"))
    plan = _plan(d.get("recovery"), f"{path}.recovery")
    buckets = kit.list_field(d, "buckets", path, _arg, required=False, non_empty=False)
    try:
        return Gang(job_id, attempt, tuple(node_ids), groups, ckpt, model, logs, plan,
                    buckets)
    except ValueError as exc:  # the groups do not cover the ranks exactly
        raise ValidationError(f"{path}.groups", str(exc)) from exc


def _plan(value: Any, path: str) -> RecoveryPlan | None:
    """The attempt's ``RecoveryPlan`` (absent: None, today's requeue or a first start)."""
    if value is None:
        return None
    d = kit.mapping(value, path, noun="an object")
    fresh = kit.list_field(d, "fresh_node_ids", path, _arg, required=False, non_empty=False)
    return RecoveryPlan(cast(str, kit.string(d, "mode", path)), tuple(fresh or ()))


def _group(value: Any, path: str) -> LaunchGroup:
    d = kit.mapping(value, path, noun="an object")
    command = kit.list_field(d, "command", path, _arg)  # its program and arguments
    env = kit.list_field(d, "env", path, _env_pair, non_empty=False)
    return LaunchGroup(kit.int_field(d, "first_rank", path), kit.int_field(d, "count", path, minimum=1),
                       command, env, _limits(d.get("limits"), f"{path}.limits"))


def _limits(value: Any, path: str = "args.workers") -> tuple[int, int]:
    """A node's (processes, memory bytes); absent (an older control plane): none."""
    if value is None:
        return 0, 0
    if not (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
        raise ValidationError(path, f"must be [processes, memory bytes], got {value!r}")
    return int(value[0]), int(value[1])


def _arg(value: Any, path: str) -> str:
    if not isinstance(value, str):  # an empty argument is still an argument
        raise ValidationError(path, f"must be a string, got {value!r}")
    return value


def _env_pair(value: Any, path: str) -> tuple[str, str]:
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise ValidationError(path, f"must be a [name, value] pair of strings, got {value!r}")
    return value[0], value[1]


def gang_of_workers(workers: Any) -> Gang:
    """The gang an earlier control plane sent as one spec per rank (a rolling upgrade)."""
    if not isinstance(workers, list) or not workers:
        raise ValidationError("args.workers", "must be a non-empty list of worker specs")
    specs = sorted((worker_from_dict(w) for w in workers), key=lambda s: s.rank)
    first = specs[0]
    attempt = (first.job_id, first.attempt, first.world_size, first.checkpoint_dir,
               first.model_dir, first.tensorboard_dir, first.buckets)
    for i, s in enumerate(specs):
        if s.rank != i:
            raise ValidationError("args.workers", f"not one spec per rank: rank {i} is missing")
        if (s.job_id, s.attempt, s.world_size, s.checkpoint_dir, s.model_dir,
                s.tensorboard_dir, s.buckets) != attempt:
            raise ValidationError("args.workers", f"rank {i} is not of rank 0's attempt")
    if len(specs) != first.world_size:
        raise ValidationError("args.workers",
                              f"{len(specs)} workers for world size {first.world_size}")
    groups: list[LaunchGroup] = []
    for s in specs:  # a run of ranks with one command and env is one group
        last = groups[-1] if groups else None
        if last is not None and (last.command, last.env, last.limits) == (s.command, s.env,
                                                                          s.limits):
            groups[-1] = LaunchGroup(last.first_rank, last.count + 1, last.command, last.env,
                                     last.limits)
        else:
            groups.append(LaunchGroup(s.rank, 1, s.command, s.env, s.limits))
    return Gang(first.job_id, first.attempt, tuple(s.node_id for s in specs), tuple(groups),
                first.checkpoint_dir, first.model_dir, first.tensorboard_dir,
                buckets=first.buckets)
