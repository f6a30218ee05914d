"""Software rollouts: a cluster's nodes reimaged wave by wave with a new version, rolled back
at the first regression.

A rollout is a record in the ``rollouts`` collection (its plan: the waves of
``shared.policies.rollout.plan_waves``, each node's previous version, the wave under way and
the state). ``advance`` moves it on from what it reads, so every trigger runs the same code
and a redelivered event changes nothing: a fleet tick, a node back in service, the API's
start. Updating a node is a repair: the version is staged on compute (``SoftwareImages``),
the node taken out of service with a REIMAGE (a busy node drains: its job checkpoints and
moves by the recovery mode checkpoint_resume chooses), and when the reimage completes the
node carries the version (``on_reimaged``) and passes the deep-check gate before it returns.

A wave is finished once each of its nodes is back in service on the new version; the next starts
then, each node as the blast-radius guard's budget allows. Before any move the updated nodes'
health is judged (``shared.policies.rollout.judge``); a regression pauses the rollout
(ROLLING_BACK) and every node that has, or is getting, the new version is reimaged with the
version it had. Observability raises ``rollout_rolled_back`` for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from services.repair import handlers as repair
from shared.domain.errors import Conflict, NotFound, ValidationError
from shared.domain.events import Event, FleetTicked, NodeDiagnosed, NodeReturnedToService
from shared.domain.health import RepairAction
from shared.domain.model import ClusterState, Job, Node, NodeRole, NodeState, Partition
from shared.handling import Deps, Outcome
from shared.policies.repair import DEEP_CHECK, allowed_out_of_service
from shared.policies.rollout import (
    ACTIVE,
    ROLLOUTS,
    Candidate,
    FleetHealth,
    RegressionConfig,
    RolloutState,
    judge,
    merged,
    parse_tolerance,
    parse_version,
    plan_waves,
)
from shared.ports import SoftwareImages, UnitOfWork
from shared.service_layer.recovery_costs import costs

MAX_WAVE = 1024
_TRUE = "true"


def _int(body: Mapping[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_WAVE:
        raise ValidationError(key, f"must be a whole number from 0 to {MAX_WAVE}")
    return value


def start(cluster_id: str, body: Mapping[str, Any], by: str, uow: UnitOfWork,
          deps: Deps) -> dict[str, Any]:
    """Plan and start a rollout of ``body["version"]``; the same request again while it runs
    answers the running rollout (a retry). Another while one runs is a Conflict."""
    version = parse_version(body.get("version"))
    wave_size, canary = _int(body, "waveSize", 1), _int(body, "canary", 1)
    tolerance = parse_tolerance(body.get("gateTolerance", 0.0))
    cluster = uow.clusters.get(cluster_id)
    if cluster is None or cluster.state is ClusterState.DELETED:
        raise NotFound("cluster", cluster_id)
    records: Any = uow
    rollouts = records.records(ROLLOUTS, {"cluster_id": cluster_id})
    running = [r for r in rollouts if r["state"] in ACTIVE]
    if running:
        if running[0]["version"] == version:
            return running[0]  # type: ignore[no-any-return]
        raise Conflict(f"cluster {cluster_id} has rollout {running[0]['id']} under way "
                       f"({running[0]['state']})")
    if cluster.state is not ClusterState.READY:
        raise Conflict(f"cluster {cluster_id} is {cluster.state.value}, not READY")
    if not isinstance(deps.compute, SoftwareImages):
        raise Conflict("this compute backend cannot choose the software a reimage writes "
                       "(no SoftwareImages): a rollout would change nothing on the nodes")
    now = deps.clock.now()
    nodes = [n for n in uow.nodes.list(cluster_id)
             if n.role is NodeRole.WORKER and n.state is not NodeState.RETIRED]
    parts = {p.name: p for p in uow.partitions.list(cluster_id)}
    plan = plan_waves([_candidate(n, uow, deps, now) for n in nodes],
                      {name: _budget(p, deps) for name, p in parts.items()}, wave_size,
                      canary if wave_size else 0)
    seq = len(rollouts) + 1
    record = {"id": f"{cluster_id}.{seq}", "seq": seq, "cluster_id": cluster_id,
              "version": version, "wave_size": wave_size, "canary": canary, "by": by,
              "gate_tolerance": tolerance,
              "waves": [list(w) for w in plan.waves], "wave": 0,
              "previous": {n.node_id: n.software for n in nodes},
              "state": RolloutState.RUNNING.value, "reason": "", "started": now,
              "time": now, "ended": None}
    records.put_record(ROLLOUTS, record["id"], record)
    advance(cluster_id, uow, deps)
    return records.record(ROLLOUTS, record["id"])  # type: ignore[no-any-return]


def _candidate(node: Node, uow: UnitOfWork, deps: Deps, now: float) -> Candidate:
    job = uow.jobs.get(node.job_id) if node.job_id else None
    return Candidate(node.node_id, node.partition, job is not None,
                     _move_cost(job, now, deps) if job is not None else 0.0)


def _move_cost(job: Job, now: float, deps: Deps) -> float:
    """The goodput (node-seconds) a move of the job costs: its cheapest tier's restore and
    lost progress, and a warm start, on each of its ranks (an estimate; the mode itself is
    chosen by checkpoint_resume when the node drains)."""
    c = costs(job, now, deps)
    finite = [t.restore_s + t.lost_s for t in c.tiers if math.isfinite(t.lost_s)]
    return (min(finite, default=0.0) + c.startup_warm_s) * max(1, len(job.node_ids))


def _budget(partition: Partition, deps: Deps) -> int:
    return allowed_out_of_service(partition.total_nodes, deps.config.repair) \
        - len(partition.out_of_service)


def active(cluster_id: str, uow: UnitOfWork) -> dict[str, Any] | None:
    records: Any = uow
    found = [r for r in records.records(ROLLOUTS, {"cluster_id": cluster_id})
             if r["state"] in ACTIVE]
    return min(found, key=lambda r: r["seq"]) if found else None


def advance(cluster_id: str, uow: UnitOfWork, deps: Deps) -> bool:
    """Move the cluster's rollout on from what it reads; True when anything changed."""
    record = active(cluster_id, uow)
    if record is None:
        return False
    rec = dict(record)
    now = deps.clock.now()
    if rec["state"] == RolloutState.RUNNING:
        verdict = judge(_health(rec, uow, now),
                        RegressionConfig(gate_tolerance=rec.get("gate_tolerance", 0.0)))
        if verdict.regressed:
            rec.update(state=RolloutState.ROLLING_BACK.value, reason=verdict.reason,
                       paused_wave=rec["wave"] + 1, time=now)
        else:
            _run_waves(rec, uow, deps)
    if rec["state"] == RolloutState.ROLLING_BACK:
        _roll_back(rec, uow, deps)
    if rec == record:
        return False
    records: Any = uow
    records.put_record(ROLLOUTS, rec["id"], {**rec, "time": now})
    return True


def _new(rec: Mapping[str, Any], node_id: str) -> dict[str, str]:
    return merged(rec["previous"].get(node_id, {}), rec["version"])


def _started(rec: Mapping[str, Any]) -> list[str]:
    return [n for wave in rec["waves"][:rec["wave"] + 1] for n in wave]


def _health(rec: Mapping[str, Any], uow: UnitOfWork, now: float) -> FleetHealth:
    """The nodes of the waves started so far against the rest: an updated node's faults and
    time count from when it was back in service on the new version (``updated_at``), the
    rest's from the rollout's start (a fault before a node's update is the old version's).
    A node that failed on the new version before it returned (its gate, or any fault
    diagnosed meanwhile, even one that had it replaced) failed its update."""
    started, since = set(_started(rec)), rec.get("updated_at", {})
    taken = rec.get("taken_at", {})
    failed: list[str] = []
    updated, updated_faults, updated_s, other_faults, other_s = 0, 0, 0.0, 0, 0.0
    for node in uow.nodes.list(rec["cluster_id"]):
        if node.role is not NodeRole.WORKER:
            continue
        new = _new(rec, node.node_id)
        ours = node.node_id in started and (node.software == new or node.software_target == new)
        if ours and node.node_id not in since and node.software == new and any(
                f.at >= taken.get(node.node_id, now) for f in node.history):
            failed.append(node.node_id)
        if node.state is NodeState.RETIRED:
            continue
        if ours:
            gate = node.conditions.get(DEEP_CHECK)
            if gate is not None and gate.status == _TRUE and node.node_id not in failed:
                failed.append(node.node_id)
            updated += 1
            done_at = since.get(node.node_id)
            if done_at is not None:
                updated_faults += sum(1 for f in node.history if f.at >= done_at)
                updated_s += max(0.0, now - done_at)
        else:
            other_faults += sum(1 for f in node.history if f.at >= rec["started"])
            other_s += max(0.0, now - rec["started"])
    return FleetHealth(tuple(failed), max(updated, len(failed)), updated_faults, updated_s,
                       other_faults, other_s)


def _run_waves(rec: dict[str, Any], uow: UnitOfWork, deps: Deps) -> None:
    while rec["wave"] < len(rec["waves"]):
        if not _update_wave(rec, rec["waves"][rec["wave"]], uow, deps):
            return
        rec["wave"] += 1
    rec.update(state=RolloutState.SUCCEEDED.value, ended=deps.clock.now(),
               wave=len(rec["waves"]) - 1)


def _update_wave(rec: dict[str, Any], wave: list[str], uow: UnitOfWork,
                 deps: Deps) -> bool:
    """Start what of the wave the guard allows; True once every node of it is done."""
    done = True
    for node_id in wave:
        node = uow.nodes.get(node_id)
        if node is None or node.state is NodeState.RETIRED:
            continue  # replaced meanwhile: its replacement is no part of this plan
        new = _new(rec, node_id)
        if node.software == new and node.software_target is None and node.in_service:
            if node_id not in rec.get("updated_at", {}):  # (a new dict: rec is compared)
                rec["updated_at"] = {**rec.get("updated_at", {}), node_id: deps.clock.now()}
            continue
        done = False
        if node.software_target != new and node.software != new and node.in_service:
            partition = _partition(uow, node)
            if _budget(partition, deps) > 0:
                rec["taken_at"] = {**rec.get("taken_at", {}), node_id: deps.clock.now()}
                _reimage(node, new, partition, f"rollout {rec['id']}: to {_label(new)}", uow,
                         deps)
    return done


def _roll_back(rec: dict[str, Any], uow: UnitOfWork, deps: Deps) -> None:
    """Every node that has or is getting the new version goes back to its own previous one;
    a node mid-reimage finishes first (compute is writing the new image), then goes back."""
    pending = False
    for node_id in _started(rec):
        node = uow.nodes.get(node_id)
        if node is None or node.state is NodeState.RETIRED:
            continue
        old = rec["previous"].get(node_id, {})
        if node.software == old and node.software_target in (None, old):
            # back on its version; done once in service (a FAILED one waits for a person)
            pending |= not node.in_service and node.state is not NodeState.FAILED
            continue
        pending = True
        if node.state is NodeState.REPAIRING:
            continue  # mid-reimage: it finishes (on the version it was given), then goes back
        if node.software_target != old:
            _stage(node, old, deps)
        if node.software != old and (node.in_service or node.state is NodeState.VERIFYING):
            _reimage(node, old, _partition(uow, node),
                     f"rollout {rec['id']} rolled back: to {_label(old)}", uow, deps)
    if not pending:
        rec.update(state=RolloutState.ROLLED_BACK.value, ended=deps.clock.now())


def _stage(node: Node, version: dict[str, str], deps: Deps) -> None:
    node.software_target = dict(version)
    assert isinstance(deps.compute, SoftwareImages)  # (checked when the rollout started)
    deps.compute.stage_software(node.node_id, version)


def _reimage(node: Node, version: dict[str, str], partition: Partition, reason: str,
             uow: UnitOfWork, deps: Deps) -> None:
    _stage(node, version, deps)
    repair.take_out(node, partition, RepairAction.REIMAGE, reason, uow, deps)


def _partition(uow: UnitOfWork, node: Node) -> Partition:
    return repair.partition_of(uow, node)


def _label(version: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(version.items())) or "the initial version"


def on_tick(event: FleetTicked, uow: UnitOfWork, deps: Deps) -> Outcome | None:
    return None if advance(event.cluster_id, uow, deps) or uow.emitted else Outcome.UNCHANGED


def on_returned(event: NodeReturnedToService, uow: UnitOfWork, deps: Deps) -> None:
    advance(event.cluster_id, uow, deps)


def on_diagnosed(event: NodeDiagnosed, uow: UnitOfWork, deps: Deps) -> None:
    """Repair's handling of a diagnosis, then the rollout's look at it: a failed deep check
    is diagnosed in the transaction that records the verdict, so the gate reads failed here
    (a tick may come only after the repair that follows has reset it to pending)."""
    repair.on_diagnosed(event, uow, deps)
    node = uow.nodes.get(event.node_id)
    if node is not None:
        advance(node.cluster_id, uow, deps)


SUBSCRIPTIONS: dict[type[Event], Any] = {  # (merged over repair's own: NodeDiagnosed wraps it)
    NodeDiagnosed: on_diagnosed,
    FleetTicked: on_tick,
    NodeReturnedToService: on_returned,
}
