"""Serving decisions (pure): where a deployed model's replicas run, which deployed model a
request goes to, and which replicas may take it, in what order.

* **placement** (``choose_pool``): a deployed model's ``machineSpec`` names a machine type
  (and, when given, an accelerator type and count); the pools offering it are those of a
  partition whose nodes have that machine. A user names the cluster (the endpoint's
  ``mtc-cluster`` label) and the partition (``mtc-partition``); otherwise the candidate with
  the most nodes in service wins (it can hold the most replicas and still move one), ties to
  the oldest cluster, then the partition's name, so the choice is the same on every call.
* **traffic** (``split_target``): a request goes to a deployed model with the probability of
  its share of ``trafficSplit`` (``roll`` is uniform in [0, 1), passed in).
* **routing** (``route_order``): only a replica whose job runs, on a node in service and not
  draining, whose health route answered, takes requests; they are tried in a rotation that
  starts at ``turn``, so load spreads and a failed try goes on to the next one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CLUSTER_LABEL = "mtc-cluster"
PARTITION_LABEL = "mtc-partition"
# node states whose replicas take requests: a SUSPECT node is held in service by the guard
ROUTABLE_NODE_STATES = frozenset({"allocated", "suspect"})


@dataclass(frozen=True)
class PoolOffer:
    """A partition's pool that has the wanted machine, with how many nodes it has in service."""

    cluster_id: str
    cluster_created: float
    partition: str
    machine_type: str
    accelerator_type: str | None
    accelerator_count: int
    in_service: int


@dataclass(frozen=True)
class Wanted:
    machine_type: str
    accelerator_type: str | None = None
    accelerator_count: int = 0
    cluster_id: str | None = None
    partition: str | None = None


def offers(pool: PoolOffer, wanted: Wanted) -> bool:
    if pool.machine_type != wanted.machine_type:
        return False
    if wanted.accelerator_type and wanted.accelerator_type != pool.accelerator_type:
        return False
    return not wanted.accelerator_count or wanted.accelerator_count == pool.accelerator_count


def choose_pool(pools: Sequence[PoolOffer], wanted: Wanted) -> PoolOffer | None:
    """The pool a deployed model's replicas run on, or None when no partition offers it."""
    fit = [p for p in pools if offers(p, wanted)
           and (wanted.cluster_id is None or p.cluster_id == wanted.cluster_id)
           and (wanted.partition is None or p.partition == wanted.partition)]
    if not fit:
        return None
    return min(fit, key=lambda p: (-p.in_service, p.cluster_created, p.cluster_id, p.partition))


def split_target(traffic: Mapping[str, int], roll: float) -> str | None:
    """The deployed model a request goes to: by its share of ``traffic`` (ids in sorted
    order, so one roll always means the same one); None when no model has traffic."""
    total = sum(v for v in traffic.values() if v > 0)
    if total <= 0:
        return None
    point = roll * total
    for key in sorted(traffic):
        share = traffic[key]
        if share <= 0:
            continue
        if point < share:
            return key
        point -= share
    return max((k for k in sorted(traffic) if traffic[k] > 0), default=None)


@dataclass(frozen=True)
class ReplicaView:
    """A replica as the router sees it: its job's state, its node's state, its health."""

    replica: str
    job_running: bool
    node_state: str | None
    healthy: bool


def routable(r: ReplicaView) -> bool:
    return r.job_running and r.node_state in ROUTABLE_NODE_STATES and r.healthy


def route_order(replicas: Sequence[ReplicaView], turn: int) -> list[str]:
    """The replicas to try for one request, in order: the routable ones, rotated by ``turn``."""
    ready = [r.replica for r in replicas if routable(r)]
    if not ready:
        return []
    k = turn % len(ready)
    return ready[k:] + ready[:k]


def replica_state(r: ReplicaView) -> str:
    """What a replica is doing, for the API and metrics: READY, DRAINING, STARTING."""
    if routable(r):
        return "READY"
    if r.job_running and r.node_state not in ROUTABLE_NODE_STATES:
        return "MOVING"
    return "STARTING"
