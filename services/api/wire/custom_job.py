"""CustomJob (aiplatform v1) as proto3 JSON: every field the API takes, none it ignores.

Fields Vertex has that mtc cannot honour (networking, encryption, TPUs, web access, NFS)
are refused with a 400 naming them, rather than accepted and ignored. mtc's own extensions
carry an ``mtc`` prefix.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, WithJsonSchema

from services.api.wire.proto_json import (
    Duration,
    Int32,
    Int64,
    Message,
    Timestamp,
    enum_parser,
    enum_schema,
)

JOB_STATES = {"JOB_STATE_UNSPECIFIED": 0, "JOB_STATE_QUEUED": 1, "JOB_STATE_PENDING": 2,
              "JOB_STATE_RUNNING": 3, "JOB_STATE_SUCCEEDED": 4, "JOB_STATE_FAILED": 5,
              "JOB_STATE_CANCELLING": 6, "JOB_STATE_CANCELLED": 7, "JOB_STATE_PAUSED": 8,
              "JOB_STATE_EXPIRED": 9, "JOB_STATE_UPDATING": 10,
              "JOB_STATE_PARTIALLY_SUCCEEDED": 11}
ACCELERATOR_TYPES = {"ACCELERATOR_TYPE_UNSPECIFIED": 0, "NVIDIA_TESLA_K80": 1,
                     "NVIDIA_TESLA_P100": 2, "NVIDIA_TESLA_V100": 3, "NVIDIA_TESLA_P4": 4,
                     "NVIDIA_TESLA_T4": 5, "NVIDIA_TESLA_A100": 8, "NVIDIA_A100_80GB": 9,
                     "NVIDIA_L4": 11, "NVIDIA_H100_80GB": 13, "NVIDIA_H100_MEGA_80GB": 14,
                     "NVIDIA_H200_141GB": 15, "NVIDIA_B200": 16, "NVIDIA_GB200": 17,
                     "NVIDIA_RTX_PRO_6000": 18, "TPU_V2": 6, "TPU_V3": 7, "TPU_V4_POD": 10,
                     "TPU_V5_LITEPOD": 12}
STRATEGIES = {"STRATEGY_UNSPECIFIED": 0, "ON_DEMAND": 1, "LOW_COST": 2, "STANDARD": 3,
              "SPOT": 4, "FLEX_START": 6}
JobStateName = Annotated[str, enum_parser("JobState", JOB_STATES),
                         enum_schema("JobState", JOB_STATES)]
AcceleratorType = Annotated[str, enum_parser("AcceleratorType", ACCELERATOR_TYPES),
                            enum_schema("AcceleratorType", ACCELERATOR_TYPES)]
Strategy = Annotated[str, enum_parser("Scheduling.Strategy", STRATEGIES),
                     enum_schema("Scheduling.Strategy", STRATEGIES)]
MAX_REPLICAS = 100_000
MAX_POOLS = 4  # Vertex: chief, workers, parameter servers, evaluators
MAX_ARGS = 1024
MAX_LABELS = 64


def _refuse(value: Any) -> Any:
    if value not in (None, "", [], {}, False, 0):
        raise ValueError("is not supported by mtc")
    return None


# A Vertex field mtc does not implement: a clear 400 naming it, not a silent default.
Unsupported = Annotated[Any, AfterValidator(_refuse),
                        WithJsonSchema({"description": "not supported by mtc: leave unset"})]


class MachineSpec(Message):
    machine_type: str = Field(default="", max_length=128)
    accelerator_type: AcceleratorType | None = None
    accelerator_count: Int32 | None = Field(default=None, ge=0, le=16)

    tpu_topology: Unsupported = None
    reservation_affinity: Unsupported = None
    gpu_partition_size: Unsupported = None


class DiskSpec(Message):
    boot_disk_type: str | None = Field(default=None, pattern=r"^(pd-ssd|pd-standard|hyperdisk-balanced)$")
    boot_disk_size_gb: Int32 | None = Field(default=None, ge=10, le=65536)


class EnvVar(Message):
    name: str = Field(max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str = Field(default="", max_length=32768)


class ContainerSpec(Message):
    image_uri: str = Field(max_length=1024)
    command: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    args: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ARGS)


class PythonPackageSpec(Message):
    executor_image_uri: str = Field(max_length=1024)
    package_uris: list[str] = Field(default_factory=list, max_length=100)
    python_module: str = Field(max_length=1024)
    args: list[str] = Field(default_factory=list, max_length=MAX_ARGS)
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ARGS)


class WorkerPoolSpec(Message):
    container_spec: ContainerSpec | None = None
    python_package_spec: PythonPackageSpec | None = None
    machine_spec: MachineSpec | None = None
    replica_count: Int64 | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    disk_spec: DiskSpec | None = None

    nfs_mounts: Unsupported = None
    lustre_mounts: Unsupported = None


class Scheduling(Message):
    timeout: Duration | None = Field(default=None, ge=1, le=30 * 24 * 3600)
    restart_job_on_worker_restart: bool | None = None
    strategy: Strategy | None = None
    disable_retries: bool | None = None
    max_wait_duration: Unsupported = None
    # mtc extensions: which partition of the cluster, queue priority, give-up limit
    mtc_partition: str | None = Field(default=None, max_length=63)
    mtc_priority: Int32 | None = Field(default=None, ge=-1000, le=1000)
    mtc_max_restarts: Int32 | None = Field(default=None, ge=0, le=10_000)


class GcsDestination(Message):
    output_uri_prefix: str = Field(max_length=1024)


class CustomJobSpec(Message):
    persistent_resource_id: str | None = Field(default=None, max_length=63)
    worker_pool_specs: list[WorkerPoolSpec] = Field(default_factory=list, max_length=MAX_POOLS)
    scheduling: Scheduling | None = None
    base_output_directory: GcsDestination | None = None
    service_account: Unsupported = None
    network: Unsupported = None
    reserved_ip_ranges: Unsupported = None
    psc_interface_config: Unsupported = None
    tensorboard: Unsupported = None
    enable_web_access: Unsupported = None
    enable_dashboard_access: Unsupported = None
    experiment: Unsupported = None
    experiment_run: Unsupported = None
    models: Unsupported = None
    protected_artifact_location_id: Unsupported = None


class RpcStatus(Message):
    """google.rpc.Status, as a failed job's ``error`` carries it."""

    code: Int32 = 0
    message: str = ""
    details: list[dict[str, Any]] = Field(default_factory=list)


class LatestCheckpoint(Message):
    step: Int64
    path: str
    time: Timestamp | None = None


class CheckpointAdvice(Message):
    """The checkpoint interval the job's history calls for (Young/Daly from its observed MTBF
    and measured save cost; ``basis``: observed | default MTBF). Output only."""

    interval_seconds: float
    mtbf_seconds: float
    save_seconds: float
    interruptions: Int32
    basis: str
    time: Timestamp | None = None


class RecoveryDecision(Message):
    """One recovery the policy chose for the job (``shared.policies.recovery``): the mode,
    the incident, why (with the numbers), the expected lost seconds and, once the new
    attempt made progress, the measured seconds from the fault. Output only."""

    attempt: Int32
    mode: str
    incident: str
    why: str
    expected_lost_seconds: float
    measured_seconds: float | None = None
    time: Timestamp | None = None


class JobQueue(Message):
    """mtc's extension: where a waiting job stands in its team's queue on a cluster with
    ``mtcQueues`` and why it waits (output only; ``shared.policies.fair_share``)."""

    team: str
    partition: str
    position: Int32  # 1-based, in its team's queue on its partition
    reason: str


class JobProgress(Message):
    """mtc's extension on a CustomJob: how self-healing went for it (output only)."""

    cluster_id: str
    attempt: Int32
    restart_count: Int32
    nodes: list[str] = Field(default_factory=list)
    latest_checkpoint: LatestCheckpoint | None = None
    checkpoint_advice: CheckpointAdvice | None = None
    recovery: list[RecoveryDecision] | None = None  # newest last; absent: none chosen
    queue: JobQueue | None = None  # absent: not waiting, or no team queues


class CustomJob(Message):
    name: str | None = None
    display_name: str = Field(default="", max_length=128)
    job_spec: CustomJobSpec | None = None
    state: JobStateName | None = None
    create_time: Timestamp | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    update_time: Timestamp | None = None
    error: RpcStatus | None = None
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_LABELS)
    web_access_uris: dict[str, str] | None = None
    mtc_progress: JobProgress | None = None
    mtc_models: list[str] | None = None  # the model versions it produced (output only)

    encryption_spec: Unsupported = None


class ListCustomJobsResponse(Message):
    custom_jobs: list[CustomJob] = Field(default_factory=list)
    next_page_token: str = ""
