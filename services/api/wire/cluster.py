"""ModelDevelopmentCluster (aiplatform v1beta1): the managed training cluster resource.

Node pools carry ``machineSpec`` and ``scalingSpec{minNodeCount, maxNodeCount}``; the Slurm
orchestrator names its partitions (``{id, nodePoolIds}``) and the login node pool. mtc keeps
pools at a fixed size, so ``minNodeCount`` must equal ``maxNodeCount`` (refused otherwise,
not silently pinned). Hot spares are mtc's extension: ``mtcHotSpareCount`` per pool, nodes
held idle to take over from a failed one. Racks, NVLink domains and switches are mtc's
extension too: ``mtcTopology`` per pool (``shared.domain.topology``).

Storage, in Vertex's fields: ``orchestratorSpec.slurmSpec.homeDirectoryStorage`` (the Filestore
instance mounted at ``/home``) and ``nodePools[].lustres`` (Managed Lustre instances, by
resource name). A Lustre instance's tier and capacity live on the instance, in the Managed
Lustre API, which mtc does not serve: ``mtcStorage.lustreInstances`` describes each in that
API's field names (``perUnitStorageThroughput``, ``capacityGib``) and says where it is
mounted; ``mtcStorage.gcsBuckets`` names the buckets a job sees at ``/gcs/<bucket>``
(``shared.domain.cluster_storage``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from services.api.wire.custom_job import MachineSpec
from services.api.wire.proto_json import (
    Int32,
    Int64,
    Message,
    Timestamp,
    enum_parser,
    enum_schema,
)

MAX_POOLS = 32
MAX_NODES_PER_POOL = 100_000
MAX_MOUNTS = 16
CLUSTER_STATES = {"STATE_UNSPECIFIED": 0, "PROVISIONING": 1, "READY": 2, "UPDATING": 3,
                  "DELETING": 4, "FAILED": 5, "DELETED": 6}
ClusterState = Annotated[str, enum_parser("ModelDevelopmentCluster.State", CLUSTER_STATES),
                         enum_schema("ModelDevelopmentCluster.State", CLUSTER_STATES)]


class Network(Message):
    network: str | None = Field(default=None, max_length=1024)
    subnetwork: str | None = Field(default=None, max_length=1024)


class ScalingSpec(Message):
    min_node_count: Int64 | None = Field(default=None, ge=0, le=MAX_NODES_PER_POOL)
    max_node_count: Int64 | None = Field(default=None, ge=0, le=MAX_NODES_PER_POOL)


class BootDisk(Message):
    boot_disk_type: str | None = Field(default=None, max_length=64)
    boot_disk_size_gb: Int32 | None = Field(default=None, ge=10, le=65536)


class NodePlace(Message):
    """mtc's extension: where one node of a pool sits (rack, NVLink domain, switch)."""

    rack: str = Field(max_length=63)
    nvlink_domain: str | None = Field(default=None, max_length=63)
    switch: str | None = Field(default=None, max_length=63)


class NodeTopology(Message):
    """mtc's extension (``mtcTopology``): a pool's racks, NVLink domains and switches,
    generated (``nodesPerRack``...) or listed per node (``nodes``); ``spareLayout``:
    ``perPartition`` (the pool's last nodes) or ``perRack`` (spread over its racks)."""

    nodes_per_rack: Int32 | None = Field(default=None, ge=1, le=MAX_NODES_PER_POOL)
    racks_per_switch: Int32 | None = Field(default=None, ge=1, le=MAX_NODES_PER_POOL)
    nodes_per_nvlink_domain: Int32 | None = Field(default=None, ge=1, le=MAX_NODES_PER_POOL)
    nodes: list[NodePlace] | None = Field(default=None, max_length=MAX_NODES_PER_POOL)
    spare_layout: str | None = Field(default=None, max_length=32)


class NodePool(Message):
    id: str = Field(max_length=63)
    machine_spec: MachineSpec | None = None
    scaling_spec: ScalingSpec | None = None
    zone: str | None = Field(default=None, max_length=64)
    enable_public_ips: bool | None = None
    boot_disk: BootDisk | None = None
    mtc_hot_spare_count: Int64 | None = Field(default=None, ge=0, le=MAX_NODES_PER_POOL)
    mtc_topology: NodeTopology | None = None
    lustres: list[str] | None = Field(default=None, max_length=MAX_MOUNTS)
    filestores: list[str] | None = Field(default=None, max_length=MAX_MOUNTS)


class SlurmPartition(Message):
    id: str = Field(max_length=63)
    node_pool_ids: list[str] = Field(default_factory=list, max_length=MAX_POOLS)


class SlurmSpec(Message):
    partitions: list[SlurmPartition] = Field(default_factory=list, max_length=MAX_POOLS)
    login_node_pool_id: str | None = Field(default=None, max_length=63)
    home_directory_storage: str | None = Field(default=None, max_length=1024)


class LustreInstance(Message):
    """mtc's extension: a Managed Lustre instance a pool names in ``lustres``, in the Managed
    Lustre API's field names (its tier in MBps per TiB, its capacity), and its mount point."""

    name: str = Field(max_length=1024)
    per_unit_storage_throughput: Int64 | None = None
    capacity_gib: Int64 | None = None
    mount_point: str | None = Field(default=None, max_length=1024)


class MtcStorage(Message):
    """mtc's extension (``mtcStorage``): what Vertex's cluster fields do not carry."""

    lustre_instances: list[LustreInstance] = Field(default_factory=list, max_length=MAX_MOUNTS)
    gcs_buckets: list[str] = Field(default_factory=list, max_length=MAX_MOUNTS)


class MtcQueue(Message):
    """mtc's extension (``mtcQueues``): one team's queue on one partition, a nominal quota in
    nodes and how many more it may borrow (absent: no limit); jobs name their team with the
    ``mtc-team`` label (``shared.domain.queues``, ``shared.policies.fair_share``)."""

    team: str = Field(max_length=63)
    partition: str = Field(max_length=63)
    nominal_nodes: Int32 = 0
    borrowing_limit_nodes: Int32 | None = None


class OrchestratorSpec(Message):
    slurm_spec: SlurmSpec | None = None


class NodeSummary(Message):
    """mtc's extension (output only): how many nodes are in each state."""

    total: Int32 = 0
    in_service: Int32 = 0
    out_of_service: Int32 = 0
    by_state: dict[str, int] = Field(default_factory=dict)
    repairs_held: Int32 = 0  # SUSPECT nodes the blast-radius guard keeps in service


class ModelDevelopmentCluster(Message):
    name: str | None = None
    display_name: str = Field(default="", max_length=128)
    network: Network | None = None
    node_pools: list[NodePool] = Field(default_factory=list, max_length=MAX_POOLS)
    orchestrator_spec: OrchestratorSpec | None = None
    state: ClusterState | None = None
    create_time: Timestamp | None = None
    update_time: Timestamp | None = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    mtc_state_message: str | None = None
    mtc_nodes: NodeSummary | None = None
    mtc_storage: MtcStorage | None = None
    mtc_queues: list[MtcQueue] = Field(default_factory=list, max_length=256)


class ListModelDevelopmentClustersResponse(Message):
    model_development_clusters: list[ModelDevelopmentCluster] = Field(default_factory=list)
    next_page_token: str = ""


class ClusterNode(Message):
    """mtc's extension: one node of a cluster, as ``sinfo`` would show it (output only)."""

    name: str
    node_id: str
    partition: str
    pool: str
    role: str
    state: str
    reason: str = ""
    since: Timestamp | None = None
    spare: bool = False
    job: str | None = None
    repair_action: str | None = None
    failures: Int32 = 0
    fault: str = ""  # the active fault that keeps it from new work
    operator_drained: bool = False  # drained by an administrator: only they resume it
    rack: str = ""  # where it sits ("" without a topology)
    nvlink_domain: str = ""


class NodeOperatorRequest(Message):
    """mtc's extension: an operator's command on a node (``:releaseHold``, ``:drain``,
    ``:resume``, ``:returnToService``) and why; the reason goes in the audit records."""

    reason: str = Field(default="", max_length=512)


class RolloutSoftwareRequest(Message):
    """mtc's extension (``:rolloutSoftware``): the version to roll out (some of nodeImage,
    driver, agent) and the waves' sizes, in nodes."""

    version: dict[str, str] = Field(default_factory=dict)
    wave_size: int = 1
    canary: int = 1
    gate_tolerance: float = 0.0


class ListClusterNodesResponse(Message):
    nodes: list[ClusterNode] = Field(default_factory=list)
    next_page_token: str = ""


FAULT_BEHAVIORS = {"BEHAVIOR_UNSPECIFIED": 0, "PERFORMANCE": 1, "SILENT_DATA_CORRUPTION": 2,
                   "UNRECOVERABLE_GPU_ERROR": 3}
FaultBehavior = Annotated[str, enum_parser("FaultReason.Behavior", FAULT_BEHAVIORS),
                          enum_schema("FaultReason.Behavior", FAULT_BEHAVIORS)]
MAX_NODE_ACTIONS = 256


class FaultReason(Message):
    behavior: FaultBehavior
    description: str = Field(default="", max_length=1000)


class ReportFaultyHost(Message):
    fault_reasons: list[FaultReason] = Field(min_length=1, max_length=16)


class NodeAction(Message):
    """One node: deleted (and recreated, same name and spec), or its host reported."""

    node_id: str = Field(min_length=1, max_length=128)
    report_faulty_host: ReportFaultyHost | None = None


class ReportFaultyNodesRequest(Message):
    """``:reportFaultyNodes``: Google's service takes one node a call; mtc takes several."""

    node_actions: list[NodeAction] = Field(min_length=1, max_length=MAX_NODE_ACTIONS)
