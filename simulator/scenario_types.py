"""What a scenario is: the defaults every scenario starts from, and the parsed sections as
frozen dataclasses (:class:`Scenario` and its parts). Parsing lives in ``simulator.scenario``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from simulator.availability import AvailabilityCfg
from simulator.durable_storage import DurableStorageCfg
from simulator.failures import FailureCfg
from simulator.readers import Dist
from simulator.rollout_model import RolloutCfg

# ---------------------------------------------------------------- constants (defaults)
# Units are in the names: _S seconds, _PER_NODE_DAY events per node per day, _FRACTION 0..1.
DEFAULT_SEED = 42
DEFAULT_DURATION_S = 54 * 86_400.0  # Llama 3 405B pretraining: 54 days
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_MACHINE_TYPE = "a3-highgpu-8g"
DEFAULT_ACCELERATOR = "NVIDIA_H100_80GB"
DEFAULT_PROVISION_MEDIAN_S = 600.0  # a fresh node boots and joins in about 10 minutes
DEFAULT_STEP_TIME_S = 10.0  # one synchronous training step at nominal speed
DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0  # compute time between two checkpoint saves
DEFAULT_CHECKPOINT_SAVE_S = 20.0  # blocking part of one save
DEFAULT_CHECKPOINT_RESTORE_S = 120.0  # load the newest checkpoint on restart
DEFAULT_STARTUP_S = 180.0  # launch, NCCL init, data loader warm-up
DEFAULT_MFU_FRACTION = 0.40  # Llama 3 405B reached 38-43% BF16 MFU
DEFAULT_CRASH_EXIT_S = 30.0  # a crashed rank takes the launcher this long to stop the rest
DEFAULT_HANG_EXIT_S = 600.0  # NCCL watchdog: ranks blocked on a dead peer give up after this
DEFAULT_LAUNCH_FAIL_S = 60.0  # workers started on a broken node fail after this
DEFAULT_MAX_RESTARTS = 1_000_000
DEFAULT_BUS_LATENCY_S = 0.05  # control-plane event delivery (Pub/Sub push) median
DEFAULT_VERIFY_INTERVAL_S = 60.0  # post-repair / post-provision health check cadence
DEFAULT_REPORT_INTERVAL_S = 300.0  # the agent re-reports a fault that persists this often
DEFAULT_SPEED_CHECK_INTERVAL_S = 1800.0  # how often a straggler's slowness is reported
DEFAULT_GRACE_PERIOD_S = 30.0  # SIGTERM to SIGKILL
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
DEFAULT_MAX_EVENT_AGE_S = 3600.0
DEFAULT_REPAIR_MEDIAN_S = {  # one rung of the repair ladder, start to result
    "reset_gpu": 180.0,
    "reboot": 900.0,
    "reimage": 3600.0,
    "replace": 2 * 86_400.0,  # on-premises hardware swap (RMA, spare chassis)
}
DEFAULT_DETECT_MEDIAN_S = 10.0  # XID / ECC / DCGM line in the kernel log to agent report


# ---------------------------------------------------------------- sections


@dataclass(frozen=True)
class PartitionCfg:
    name: str
    nodes: int  # workers, spares included
    spares: int
    nodes_per_rack: int = 0  # racks of this many nodes (0: no topology)
    spare_layout: str = "perPartition"  # or "perRack" (shared.domain.topology)


@dataclass(frozen=True)
class PreflightCfg:
    """The cluster's preflight (its label ``mtc-preflight``) as the twin prices it: each
    preflight takes ``duration_s`` of the job's waiting time and catches each node with a
    latent fault with probability ``catches`` (``simulator.preflight_model``)."""

    mode: str = "off"
    duration_s: float = 0.0
    catches: float = 0.0


@dataclass(frozen=True)
class QueueCfg:
    """A team's queue on a partition (``shared.domain.queues``): nominal quota in nodes and
    how many more it may borrow (None: no limit)."""

    team: str
    partition: str
    nominal: int
    borrowing_limit: int | None = None


@dataclass(frozen=True)
class ClusterCfg:
    cluster_id: str
    gpus_per_node: int
    machine_type: str
    accelerator: str
    partitions: tuple[PartitionCfg, ...]
    provision: Dist
    preflight: PreflightCfg = PreflightCfg()
    queues: tuple[QueueCfg, ...] = ()  # team quotas (fair share); none: no quotas

    @property
    def nodes(self) -> int:
        return sum(p.nodes for p in self.partitions)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class JobCfg:
    name: str
    partition: str
    nodes: int
    step_time_s: float
    checkpoint_interval_s: float
    checkpoint_save_s: float
    checkpoint_restore_s: float
    startup_s: float
    warmup_s: float  # the first step after every start takes this much longer
    mfu: float
    work_s: float | None  # nominal compute time to finish; None: train until the horizon
    submit_at_s: float  # after the cluster is ready
    priority: int
    crash_exit_s: float
    hang_exit_s: float
    launch_fail_s: float
    max_restarts: int
    # the program reports its progress per rank (mtc_program.progress): a hang is found at
    # the policy's threshold (shared.policies.hangs) and named on its culprit's node instead
    # of waiting hang_exit_s for the NCCL watchdog
    rank_progress: bool = False
    team: str = ""  # its mtc-team label on a cluster with queues ("": the default queue)

    @property
    def steps_per_checkpoint(self) -> int:
        return max(1, round(self.checkpoint_interval_s / self.step_time_s))


@dataclass(frozen=True)
class RepairCfg:
    durations: Mapping[str, Dist]  # per RepairAction value
    mechanical_failure: Mapping[str, float]  # the action itself fails (probability)
    verify_interval_s: float
    instant: bool = False  # every repair takes no time, fixes any fault and never fails


@dataclass(frozen=True)
class BusCfg:
    latency: Dist
    duplicate: float  # probability that an event is delivered twice
    reorder: float  # probability that an event is held back (and so overtaken)
    reorder_delay: Dist
    retry_delay_s: float
    max_deliveries: int


@dataclass(frozen=True)
class ControlPlaneCfg:
    triage_table: str | None  # a triage table YAML path; None: the packaged one
    repair: Mapping[str, Any]  # shared.policies.repair.load_repair_config input
    grace_period_s: float
    heartbeat_timeout_s: float
    max_event_age_s: float
    backfill: bool


# checkpoint tiers and recovery modes: parsed and turned into numbers by
# simulator.recovery_config
@dataclass(frozen=True)
class RecoveryCfg:
    tiers: tuple[str, ...]  # in TIER_ORDER
    mode: str  # auto or a Mode value
    min_replicas: int | None
    parameters: float
    bytes_per_parameter: float
    memory_gb_s: float
    peer_gb_s: float
    durable_gb_s: float
    memory_every_s: float
    peer_every_s: float
    durable_every_s: float | None  # None: the job's checkpoint_interval
    startup_warm_s: float  # in place: processes restarted on the nodes that stayed
    spares_warm: bool
    startup_hot_swap_s: float = 0.0  # a warm spare's rank joins (0: as startup_warm)
    startup_scale_down_s: float = 0.0  # the survivors re-shard (0: as startup_warm)
    rebuild_s_per_kgpu: float = 0.0  # teardown and communicator rebuild, per 1,000 GPUs
    largest_rank_gb: float = 0.0  # the largest rank's state (0: every rank the mean shard)
    copy_interference: float = 0.0  # share of step time a background copy takes
    fallback_probability: float = 0.0  # a warm / near-tier recovery fails, falls back
    recur_probability: float = 0.0  # a software fault repeats after the restart
    recur_after_s: float = 600.0  # ... this long after the restarted job's first step
    recur_fixed_after_s: float = 21600.0  # ... until a code fix, this long after it first hit
    recur_causes: tuple[str, ...] = ("software_bug",)
    # where the save on SIGTERM goes: memory (then the peer), or durable (a program that
    # writes its final checkpoint to durable storage, as examples/train.py does)
    sigterm_save: str = "memory"
    # the save on SIGTERM is reported this long before the process exits (the library's
    # report, then the exit; both cross the bus): assumed 1 s, a live run measures it
    report_before_exit_s: float = 1.0
    # the durable tier's restore bandwidth where it differs from the save's (None: the same)
    durable_restore_gb_s: float | None = None
    # the cluster's storage the durable bandwidths were derived from (None: given)
    durable_storage: DurableStorageCfg | None = None

    @property
    def pinned(self) -> str | None:
        """The mode the job is pinned to (None: the policy chooses; with durable alone it
        has no alternative to a requeue)."""
        return self.mode if self.mode != "auto" else None



@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    duration_s: float
    cluster: ClusterCfg
    jobs: tuple[JobCfg, ...]
    failures: FailureCfg
    repair: RepairCfg
    detection: Mapping[str, Dist]
    bus: BusCfg
    control_plane: ControlPlaneCfg
    checkpoint_events: str  # latest | all
    report_interval_s: float = DEFAULT_REPORT_INTERVAL_S  # detection.report_interval
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)
    # how the capacity is bought and what it costs (simulator.availability): its own block
    availability: AvailabilityCfg = field(default_factory=AvailabilityCfg)
    # checkpoint tiers and recovery modes (simulator.recovery_config); None: durable alone
    recovery: RecoveryCfg | None = None
    # a software rollout during the run (simulator.rollout_model); None: none
    rollout: RolloutCfg | None = None
