"""modelDevelopmentClusters (v1beta1): the managed training cluster, in its documented shape.

The wire resource is turned into the domain's cluster spec: worker pools with a fixed size
(``scalingSpec`` min == max), the login pool's machine, Slurm partitions. Errors the domain
finds are reported at the wire field the caller wrote.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from services.api import buckets, ids
from services.api import operations as ops
from services.api.collection import Collection, Scope
from services.api.context import ApiContext, create_id, load_record, records_of, save_record
from services.api.errors import ApiError, FieldViolation, invalid, not_found
from services.api.names import Parent, resource_id
from services.api.wire.cluster import (
    ClusterNode,
    ListClusterNodesResponse,
    ListModelDevelopmentClustersResponse,
    ModelDevelopmentCluster,
)
from services.api.wire.proto_json import timestamp
from services.api.wiremodel import parse_message
from services.job_submission import commands as job_commands
from services.observability import alerts
from services.presentation.views import service_message, shown_job_id
from shared.domain import lifecycle
from shared.domain.errors import ValidationError
from shared.domain.model import IN_SERVICE, Cluster, ClusterState, Job, Node, NodeRole, NodeState
from shared.domain.specs import ClusterSpec
from shared.policies import preflight, recovery

T = TypeVar("T")
KIND = "cluster"
COLLECTION = "modelDevelopmentClusters"
FILTERABLE = ("state", "displayName")
MAX_CLUSTER_NODES = 16_384
Shown = tuple[Cluster, dict[str, Any]]  # a cluster and its API record


def create(ctx: ApiContext, parent: Parent, body: Any, cluster_id: str | None,
           generated: str | None = None) -> dict[str, Any]:
    """``generated`` is not used: a cluster's id is always the client's, so a retry with
    the same id and body already answers what the first create made."""
    if not cluster_id:
        raise invalid("modelDevelopmentClusterId", "is required (a query parameter)")
    resource_id(cluster_id, "modelDevelopmentClusterId")
    message = parse_message(ModelDevelopmentCluster, body)
    domain_body(cluster_id, message)  # the wire checks, before anything is pinned
    with ctx.unit() as uow:
        # the cluster's id in the domain: its own in the home project, else one derived from
        # (parent, id) alone (services.api.ids): another project's cluster ``ca`` is not seen
        domain_id = create_id(uow, KIND, cluster_id, parent, ctx.now)
        domain = domain_body(domain_id, message)
        buckets.claim(uow, parent, _storage_buckets(message), ctx.now)
        domain["displayName"] = message.display_name or cluster_id
        record = uow.record("api_resources", f"{KIND}:{domain_id}")
        existing = uow.clusters.get(domain_id)
        if existing is not None and existing.state is not ClusterState.DELETED and (
                record is None or record["parent"] != parent.name
                or record["resource"] != _stored(message)):
            raise ApiError("ALREADY_EXISTS", f"{parent.child(COLLECTION, cluster_id)} "
                           "already exists")
        cluster = _mapped(lambda: job_commands.create_cluster(domain, uow, ctx.runtime.deps),
                          message)
        save_record(uow, KIND, cluster_id, parent, _stored(message), ctx.now)
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=domain_id,
                                               verb="create", generation=cluster.generation)
        return ops.render(uow, op, ctx.now, _renderer(uow, parent))


def update(ctx: ApiContext, parent: Parent, cluster_id: str, body: Any, *,
           force: bool = False) -> dict[str, Any]:
    """Update takes the full resource (as documented): pools resized, added or removed,
    partitions re-drawn; a pool's machine cannot change. A change that would stop a running
    job is refused unless ``force``: then the jobs that no longer fit checkpoint (SIGTERM,
    grace) and end CANCELLED, and the nodes that leave drain first."""
    message = parse_message(ModelDevelopmentCluster, body)
    if message.name and message.name != parent.child(COLLECTION, cluster_id):
        raise invalid("name", f"must be {parent.child(COLLECTION, cluster_id)} or empty")
    domain_body(cluster_id, message)  # the wire checks first
    with ctx.unit() as uow:
        record = load_record(uow, KIND, cluster_id, parent, parent.child(COLLECTION, cluster_id))
        domain_id = ids.domain_of(record)
        domain = domain_body(domain_id, message)
        buckets.claim(uow, parent, _storage_buckets(message), ctx.now)
        domain["displayName"] = message.display_name or cluster_id
        cluster = job_commands.get_cluster(domain_id, uow)
        new_spec = _mapped(lambda: ClusterSpec.parse(domain), message)
        unfit, drained = _disruption(uow, cluster, new_spec)
        if (unfit or drained) and not force:
            raise ApiError("FAILED_PRECONDITION", _disruption_message(unfit, drained))
        for job in unfit:
            job_commands.cancel_job(job.job_id, uow, ctx.runtime.deps)
            job.error = "the cluster was resized below what the job needs"
        cluster = _mapped(lambda: job_commands.update_cluster(domain_id, domain, uow,
                                                              ctx.runtime.deps), message)
        save_record(uow, KIND, cluster_id, parent, _stored(message), ctx.now,
                    created=record["created"])
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=domain_id,
                                               verb="update", generation=cluster.generation)
        return ops.render(uow, op, ctx.now, _renderer(uow, parent))


def _disruption(uow: Any, cluster: Cluster, new_spec: ClusterSpec) -> tuple[list[Job], list[Job]]:
    """The unfinished jobs that would no longer fit, and the running jobs whose nodes the
    shrink would take (more nodes leave a pool than it has idle)."""
    resized = dataclasses.replace(cluster, spec=new_spec)
    unfinished = [j for j in uow.jobs.list(cluster.cluster_id) if not j.terminal]
    unfit = []
    for job in unfinished:
        try:
            job_commands.check_fits(resized, job.spec)
        except ValidationError:
            unfit.append(job)
    drained: list[Job] = []
    nodes = [n for n in uow.nodes.list(cluster.cluster_id)
             if n.role is NodeRole.WORKER and n.state is not NodeState.RETIRED
             and not n.retire_when_drained]
    for pool in cluster.spec.node_pools:
        target = next((p.node_count for p in new_spec.node_pools if p.pool_id == pool.pool_id), 0)
        mine = [n for n in nodes if n.pool == pool.pool_id]
        busy = [n for n in mine if n.state is NodeState.ALLOCATED and n.job_id]
        if len(mine) - target > len(mine) - len(busy):
            ids = {n.job_id for n in busy}
            drained += [j for j in unfinished if j.job_id in ids and j not in unfit
                        and j not in drained]
    return unfit, drained


def _disruption_message(unfit: list[Job], drained: list[Job]) -> str:
    parts = []
    if unfit:
        parts.append(f"job(s) {', '.join(j.job_id for j in unfit[:5])} would no longer fit")
    if drained:
        parts.append(f"job(s) {', '.join(j.job_id for j in drained[:5])} would lose nodes "
                     "and restart")
    return "; ".join(parts) + ": pass force=true to checkpoint them (SIGTERM, grace) and apply"


def delete(ctx: ApiContext, parent: Parent, cluster_id: str, *, force: bool = False
           ) -> dict[str, Any]:
    """Deleting a cluster with unfinished jobs is refused unless ``force``: then every job
    checkpoints (SIGTERM, grace) and ends CANCELLED, and the machines go after they exit."""
    with ctx.unit() as uow:
        record = load_record(uow, KIND, cluster_id, parent, parent.child(COLLECTION, cluster_id))
        domain_id = ids.domain_of(record)
        cluster = job_commands.get_cluster(domain_id, uow)
        busy = [j for j in uow.jobs.list(domain_id) if not j.terminal]
        if busy and not force:
            raise ApiError("FAILED_PRECONDITION", f"cluster {cluster_id} still has "
                           f"{len(busy)} unfinished job(s) "
                           f"({', '.join(j.job_id for j in busy[:5])}): cancel them, or pass "
                           "force=true to checkpoint and cancel them before the delete")
        for job in busy:
            job_commands.cancel_job(job.job_id, uow, ctx.runtime.deps)
            job.error = job.error or "cluster deleted"
        job_commands.delete_cluster(domain_id, uow, ctx.runtime.deps)
        op = Scope(ctx, uow, parent).operation(target=KIND, target_id=domain_id,
                                               verb="delete", generation=cluster.generation)
        return ops.render(uow, op, ctx.now)


def nodes(ctx: ApiContext, parent: Parent, cluster_id: str, *, size: str | None = None,
          token: str | None = None) -> dict[str, Any]:
    """mtc's extension: the cluster's nodes, as sinfo shows them (no filter)."""
    return NODES.list_page(ctx, parent, size=size, token=token, owner=cluster_id)


def _nodes_of(scope: Scope) -> list[Node]:
    cluster_id, parent = scope.owner, scope.parent
    record = load_record(scope.uow, KIND, cluster_id, parent,
                         parent.child(COLLECTION, cluster_id))
    return sorted(scope.uow.nodes.list(ids.domain_of(record)), key=lambda n: n.node_id)


def node_view(parent: Parent, cluster_id: str, n: Node) -> ClusterNode:
    shown = ids.api_node(n.cluster_id, cluster_id, n.node_id)
    return ClusterNode(
        name=f"{parent.child(COLLECTION, cluster_id)}/nodes/{shown}",
        node_id=shown, partition=n.partition or "-", pool=n.pool, role=n.role.value,
        state=n.state.value, reason=n.reason, since=timestamp(n.since), spare=n.is_spare,
        job=n.job_id and shown_job_id(n.job_id),
        repair_action=n.repair_action.value if n.repair_action else None,
        failures=len(n.history), fault=n.fault,
        operator_drained=lifecycle.operator_drained(n), rack=n.rack,
        nvlink_domain=n.nvlink_domain)


# ---------------------------------------------------------------- conversion


def domain_body(cluster_id: str, message: ModelDevelopmentCluster) -> dict[str, Any]:
    slurm = message.orchestrator_spec.slurm_spec if message.orchestrator_spec else None
    login_id = slurm.login_node_pool_id if slurm else None
    pool_ids = [p.id for p in message.node_pools]
    if login_id and login_id not in pool_ids:
        raise invalid("orchestratorSpec.slurmSpec.loginNodePoolId",
                      f"names no node pool ({login_id!r})")
    login_type = "n2-standard-8"
    pools: list[dict[str, Any]] = []
    total = 0
    for i, pool in enumerate(message.node_pools):
        where = f"nodePools[{i}]"
        if pool.machine_spec is None or not pool.machine_spec.machine_type:
            raise invalid(f"{where}.machineSpec.machineType", "is required")
        count = _fixed_size(pool.scaling_spec, where)
        if pool.id == login_id:
            if count != 1:
                raise invalid(f"{where}.scalingSpec.minNodeCount",
                              "the login pool has exactly one node here")
            login_type = pool.machine_spec.machine_type
            continue
        machine = pool.machine_spec.to_json()
        if machine.get("acceleratorType") == "ACCELERATOR_TYPE_UNSPECIFIED":
            machine.pop("acceleratorType")
        pools.append({"id": pool.id, "machineSpec": machine, "nodeCount": count,
                      "spareCount": pool.mtc_hot_spare_count or 0})
        if pool.mtc_topology is not None:
            pools[-1]["topology"] = pool.mtc_topology.to_json()
        total += count
    if total > MAX_CLUSTER_NODES:
        raise invalid("nodePools", f"at most {MAX_CLUSTER_NODES} worker nodes per cluster (the "
                      f"largest fleet measured, docs/scale.md); got {total}")
    body: dict[str, Any] = {"clusterId": cluster_id,
                            "displayName": message.display_name or cluster_id,
                            "loginNode": {"machineType": login_type}, "nodePools": pools}
    if slurm and slurm.partitions:
        body["partitions"] = [{"name": p.id, "nodePoolIds": list(p.node_pool_ids)}
                              for p in slurm.partitions]
    # the labels mtc reads: the recovery pin (shared.policies.recovery; docs/recovery.md) and
    # the preflight mode (shared.policies.preflight; docs/preflight.md)
    read = (recovery.MODE_LABEL, preflight.LABEL, preflight.FLOOR_LABEL)
    labels = {k: message.labels[k] for k in read if k in message.labels}
    if labels:
        body["labels"] = labels
    storage = storage_body(message, login_id)
    if storage:
        body["storage"] = storage
    if message.mtc_queues:  # team quotas (shared.domain.queues): validated with the spec
        body["queues"] = [q.to_json() for q in message.mtc_queues]
    return body


def storage_body(message: ModelDevelopmentCluster, login_id: str | None) -> dict[str, Any]:
    """The domain's storage from Vertex's fields and ``mtcStorage``. Refused by name: a pool's
    ``filestores`` (mtc mounts one Filestore, at /home), worker pools that mount different
    Lustre instances (the embedded default mounts the cluster's on every job), and a Lustre
    instance named on one side only (its tier is needed to mount it, and to model it)."""
    slurm = message.orchestrator_spec.slurm_spec if message.orchestrator_spec else None
    named: dict[str, str] = {}
    workers: list[tuple[int, list[str]]] = []
    for i, pool in enumerate(message.node_pools):
        if pool.filestores:
            raise invalid(f"nodePools[{i}].filestores", "is not supported: mtc mounts one "
                          "Filestore share, orchestratorSpec.slurmSpec.homeDirectoryStorage, "
                          "at /home")
        for j, name in enumerate(pool.lustres or []):
            named.setdefault(name, f"nodePools[{i}].lustres[{j}]")
        if pool.id != login_id:
            workers.append((i, sorted(set(pool.lustres or []))))
    for i, names in workers[1:]:
        if names != workers[0][1]:
            raise invalid(f"nodePools[{i}].lustres", "every worker pool must mount the same "
                          f"Lustre instances here (nodePools[{workers[0][0]}] mounts "
                          f"{workers[0][1] or 'none'})")
    extra = message.mtc_storage
    described = [x.to_json() for x in extra.lustre_instances] if extra else []
    for i, item in enumerate(described):
        if item.get("name") not in named:
            raise invalid(f"mtcStorage.lustreInstances[{i}].name", "names an instance no node "
                          "pool mounts (list it in nodePools[].lustres)")
    for name, where in named.items():
        if name not in [d.get("name") for d in described]:
            raise invalid(where, f"{name!r} is not described: add it to "
                          "mtcStorage.lustreInstances with its perUnitStorageThroughput and "
                          "capacityGib (mtc has no Managed Lustre API to read them from)")
    for item in described:
        for key in ("perUnitStorageThroughput", "capacityGib"):
            if isinstance(item.get(key), str):  # int64 is a decimal string in proto JSON
                item[key] = int(item[key])
    out: dict[str, Any] = {}
    if slurm and slurm.home_directory_storage:
        out["homeDirectoryStorage"] = slurm.home_directory_storage
    if described:
        out["lustres"] = described
    if extra and extra.gcs_buckets:
        out["gcsBuckets"] = list(extra.gcs_buckets)
    return out


def _storage_buckets(message: ModelDevelopmentCluster) -> list[buckets.Named]:
    """The buckets a cluster mounts into its jobs: its project's own, like every bucket a
    job names (one another project owns is a 403 naming it; services.api.buckets)."""
    named = message.mtc_storage.gcs_buckets if message.mtc_storage else []
    return [(f"mtcStorage.gcsBuckets[{i}]", f"gs://{b}") for i, b in enumerate(named)]


def _fixed_size(scaling: Any, where: str) -> int:
    if scaling is None or (scaling.min_node_count is None and scaling.max_node_count is None):
        raise invalid(f"{where}.scalingSpec", "is required: minNodeCount and maxNodeCount")
    low = scaling.min_node_count if scaling.min_node_count is not None else scaling.max_node_count
    high = scaling.max_node_count if scaling.max_node_count is not None else low
    if high != low:
        raise invalid(f"{where}.scalingSpec.maxNodeCount", "must equal minNodeCount: mtc keeps "
                      f"a pool at a fixed size (got {low} and {high})")
    return int(low)


def _mapped(call: Callable[[], T], message: ModelDevelopmentCluster) -> T:
    """Run a domain call; its field paths are renamed to the wire fields they came from."""
    try:
        return call()
    except ValidationError as exc:
        path = wire_path(exc.path, message)
        raise ApiError("INVALID_ARGUMENT", f"{path}: {exc.reason}",
                       [FieldViolation(path, exc.reason)]) from exc


def wire_path(path: str, message: ModelDevelopmentCluster) -> str:
    slurm = message.orchestrator_spec.slurm_spec if message.orchestrator_spec else None
    login_id = slurm.login_node_pool_id if slurm else None
    workers = [i for i, p in enumerate(message.node_pools) if p.id != login_id]

    def pool(match: re.Match[str]) -> str:
        j = int(match.group(1))
        return f"nodePools[{workers[j] if j < len(workers) else j}]"

    path = re.sub(r"^nodePools\[(\d+)\]", pool, path)
    path = path.replace(".nodeCount", ".scalingSpec.minNodeCount")
    path = path.replace(".spareCount", ".mtcHotSpareCount")
    path = path.replace(".topology", ".mtcTopology")
    path = re.sub(r"^partitions\[(\d+)\]\.name", r"orchestratorSpec.slurmSpec.partitions[\1].id",
                  path)
    path = re.sub(r"^partitions", "orchestratorSpec.slurmSpec.partitions", path)
    path = path.replace("storage.homeDirectoryStorage",
                        "orchestratorSpec.slurmSpec.homeDirectoryStorage")
    path = re.sub(r"^storage\.lustres", "mtcStorage.lustreInstances", path)
    path = re.sub(r"^storage\.gcsBuckets", "mtcStorage.gcsBuckets", path)
    path = re.sub(r"^queues", "mtcQueues", path)
    return path.replace("clusterId", "modelDevelopmentClusterId")


def _stored(message: ModelDevelopmentCluster) -> dict[str, Any]:
    keep = {"displayName", "network", "nodePools", "orchestratorSpec", "labels", "mtcStorage",
            "mtcQueues"}
    return {k: v for k, v in message.to_json().items() if k in keep}


def render(uow: Any, cluster: Cluster, parent: Parent, record: dict[str, Any]
           ) -> dict[str, Any]:
    by_state: dict[str, int] = {}
    total = in_service = 0
    held: list[str] = []
    for node in uow.nodes.list(cluster.cluster_id):
        if node.role.value == "login" or node.retire_when_drained:
            continue  # the login node; nodes leaving in a scale-down
        total += 1
        by_state[node.state.value] = by_state.get(node.state.value, 0) + 1
        in_service += node.state in IN_SERVICE
        if alerts.held(node):
            held.append(node.node_id)
    out = {"name": parent.child(COLLECTION, record["id"]), **record["resource"],
           "state": cluster.state.value, "createTime": timestamp(record["created"]),
           "updateTime": timestamp(cluster.updated_at),
           "mtcStateMessage": _message(service_message(cluster.message, total, {
               s: n for s, n in by_state.items() if NodeState(s) not in IN_SERVICE}),
               held, record["id"]) or None,
           "mtcNodes": {"total": total, "inService": in_service,
                        "outOfService": total - in_service, "byState": by_state,
                        "repairsHeld": len(held)}}
    return ModelDevelopmentCluster.model_validate(out).to_json()


def _message(message: str, held: list[str], cluster_id: str) -> str:
    """The cluster's state message; held repairs are said wherever its health is shown (a
    node kept in service with a fault must not read as "all nodes in service")."""
    if not held:
        return message
    first = sorted(held)[0]
    note = (f"{len(held)} repair{'s' if len(held) > 1 else ''} held by the blast-radius guard "
            f"({', '.join(sorted(held)[:3])}{'...' if len(held) > 3 else ''}); release with "
            f"`mtc node release-hold {first} --cluster {cluster_id} --reason WHY`")
    return f"{message}; {note}" if message else note


def _renderer(uow: Any, parent: Parent) -> Any:
    def render_cluster(cluster: Cluster) -> dict[str, Any]:
        record = uow.record("api_resources", f"{KIND}:{cluster.cluster_id}")
        return render(uow, cluster, parent, record) if record else {}
    return render_cluster


def _listed(scope: Scope) -> Iterator[Shown]:
    for record in records_of(scope.uow, KIND, scope.parent):
        cluster = scope.uow.clusters.get(ids.domain_of(record))
        if cluster is not None and cluster.state is not ClusterState.DELETED:
            yield cluster, record


def _found(scope: Scope, cluster_id: str) -> Shown:
    name = scope.parent.child(COLLECTION, cluster_id)
    record = load_record(scope.uow, KIND, cluster_id, scope.parent, name)
    cluster = scope.uow.clusters.get(ids.domain_of(record))
    if cluster is None or cluster.state is ClusterState.DELETED:
        raise not_found(name)
    return cluster, record


CLUSTERS: Collection[Shown] = Collection(
    ListModelDevelopmentClustersResponse, "model_development_clusters", ModelDevelopmentCluster,
    load=_listed, render=lambda scope, shown: render(scope.uow, shown[0], scope.parent, shown[1]),
    filterable=FILTERABLE, find=_found, create=create, id_param="modelDevelopmentClusterId")
NODES: Collection[Node] = Collection(
    ListClusterNodesResponse, "nodes", ClusterNode, load=_nodes_of,
    render=lambda scope, n: node_view(scope.parent, scope.owner, n).to_json())
get, list_clusters = CLUSTERS.get, CLUSTERS.list_page
