"""The scenario's ``recovery`` block: the job's checkpoint tiers and recovery modes.

```yaml
recovery:
  tiers: [memory, peer, durable]   # or durable (alone); memory needs durable, peer memory
  mode: auto                       # auto (the policy chooses) | in_place | hot_swap |
                                   # scale_down | requeue (pinned, the job's mtc-recovery-mode)
  min_replicas: 2040               # elastic: the job may shrink to this many nodes (its
                                   # data-parallel replicas; mtc-min-replicas); none: rigid
  parameters: 405e9                # model parameters
  bytes_per_parameter: 14          # checkpointed state per parameter
  memory_gb_s: 10                  # tier 1: device-to-host copy, GB/s per GPU
  peer_gb_s: 12.5                  # tier 2: network to the buddy node, GB/s per node
  durable_gb_s: 2000               # tier 3: object storage, GB/s for the whole job (aggregate)
  durable_storage: {...}           # or: derived from the cluster's Lustre (durable_storage.py)
  memory_every: 2m                 # compute time between tier-1 snapshots
  peer_every: 2m                   # between tier-2 copies (from the snapshot, asynchronous)
  durable_every: 15m               # between tier-3 saves (default: the job's interval)
  startup_warm: 30s                # in place: processes restarted on the nodes that stayed
  startup_hot_swap: 1m             # hot swap: a warm spare's rank starts and joins
  startup_scale_down: 90s          # scale down: the survivors re-shard to fewer replicas
  rebuild_s_per_kgpu: 2            # teardown and communicator rebuild, s per 1,000 GPUs
  largest_rank_gb: 4               # the largest rank's state, GB (0: a uniform shard)
  copy_interference: 0.1           # share of step time a background copy takes
  fallback_probability: 0.05       # a warm or near-tier recovery fails: cold, from durable
  recur_probability: 0.2           # a software fault repeats after the restart ...
  recur_after: 10m                 # ... this long after the restarted job's first step
  recur_fixed_after: 6h            # ... until a code fix, this long after it first hit
  recur_causes: [software_bug]     # the causes that are the program's own bugs
  spares: warm                     # warm (container and runtime up) | cold (start from scratch)
  sigterm_save: memory             # the save on SIGTERM: memory (and peer) | durable
  report_before_exit: 1s           # the save on SIGTERM is reported this long before the exit
```

Each default's source is beside it below and in docs/simulator.md ("Assumptions and their
sources"); one without a public figure says "assumed".

Every size and time is derived here, once, into a :class:`TierPlan` per job: a tier never
saves more often than its bandwidth allows (an entry every ``k`` snapshots, ``k`` at least the
transfer time over the snapshot cycle) and restores in size / bandwidth. Without a ``recovery``
block a job checkpoints to durable storage only, with its own ``checkpoint_save`` /
``checkpoint_restore``. With ``durable_storage`` the durable tier's save and restore
bandwidths are derived from the cluster's Lustre instance (``simulator.durable_storage``) and
``durable_gb_s`` is not read.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace
from typing import Any

from shared.policies.recovery import Mode, Tier
from simulator.durable_storage import parse_durable_storage
from simulator.readers import ScenarioError, duration, get, integer, join, mapping, number, only_keys, text
from simulator.scenario_types import JobCfg, RecoveryCfg

RECOVERY_KEYS = ("tiers", "mode", "min_replicas", "parameters", "bytes_per_parameter",
                 "memory_gb_s", "peer_gb_s", "durable_gb_s", "memory_every", "peer_every",
                 "durable_every", "startup_warm", "spares", "startup_hot_swap",
                 "startup_scale_down", "rebuild_s_per_kgpu", "largest_rank_gb",
                 "copy_interference", "fallback_probability", "recur_probability",
                 "recur_after", "recur_fixed_after", "recur_causes", "sigterm_save",
                 "report_before_exit", "durable_storage")
MODES = ("auto", *(m.value for m in Mode))
TIER_ORDER = (Tier.MEMORY.value, Tier.PEER.value, Tier.DURABLE.value)

# Defaults: Llama 3 405B and public figures (docs/simulator.md, "Tiers and recovery modes")
DEFAULT_PARAMETERS = 405e9  # Llama 3 405B
DEFAULT_BYTES_PER_PARAMETER = 14.0  # bf16 weights 2 + fp32 master 4 + Adam m 4 + v 4 (ZeRO)
DEFAULT_MEMORY_GB_S = 10.0  # per GPU: a sixth of PCIe Gen5 x16 (64 GB/s a direction)
DEFAULT_PEER_GB_S = 12.5  # per node: 100 Gb/s, 1/32 of a node's 8 x 400 Gb/s RoCE
DEFAULT_DURABLE_GB_S = 2000.0  # aggregate: Tectonic's sustained 2 TB/s (Llama 3 paper)
DEFAULT_MEMORY_EVERY_S = 120.0
# Warm restarts per mode, before the teardown and rebuild below. Assumed: no public split by
# mode; ordered as the reference says (a hot swap starts a cold rank, a scale-down re-shards)
# and bounded by whole fault-to-resume figures: HyperPod "under 2 minutes" (vendor),
# FlashRecovery 150 s at 4,800 devices (arXiv 2509.03047), DeadPool < 40 s at <= 512 A100.
DEFAULT_STARTUP_WARM_S = 30.0  # in place (assumed)
DEFAULT_STARTUP_HOT_SWAP_S = 60.0  # hot swap (assumed)
DEFAULT_STARTUP_SCALE_DOWN_S = 90.0  # scale down, the re-shard included (assumed)
# Teardown of the old processes and NCCL communicator rebuild, linear in GPUs: "tens of
# seconds at 10k+ GPUs" (field reports); 2 s per 1,000 GPUs is 33 s at 16,640 (assumed slope).
DEFAULT_REBUILD_S_PER_KGPU = 2.0
# The largest rank's state blocks every snapshot: Llama 3 reports 1 MB to 4 GB per GPU
# (arXiv 2407.21783, section 3.3.1).
DEFAULT_LARGEST_RANK_GB = 4.0
# Share of step time lost while a background (peer or durable) copy runs: assumed (no public
# figure for this layout; CheckFreq, FAST '21, keeps its pipelined snapshot overhead < 3.5%).
DEFAULT_COPY_INTERFERENCE = 0.1
# A warm or near-tier recovery that fails (a corrupted CUDA context, a bad local entry) and
# falls back to a cold start from durable storage: assumed (Megatron-LM#5281: 44 restarts
# after a bad local-checkpoint restore shows it happens, not how often).
DEFAULT_FALLBACK_PROBABILITY = 0.05
# A software fault that repeats after the restart until a code fix (a restart loop): assumed.
DEFAULT_RECUR_PROBABILITY = 0.2
DEFAULT_RECUR_AFTER_S = 600.0
DEFAULT_RECUR_FIXED_AFTER_S = 21600.0
DEFAULT_RECUR_CAUSES = ("software_bug",)
GB = 1e9


@dataclass(frozen=True)
class TierPlan:
    """One job's tiers in numbers. Snapshots every ``interval_s`` of compute, each blocking
    ``save_s``; tier ``t`` keeps every ``every[t]``-th snapshot, complete ``lag_s[t]`` after
    it; restoring from it takes ``restore_s[t]``. ``final_save_s``: the save on SIGTERM
    (blocking copy, then the replication the next attempt needs)."""

    tiers: tuple[str, ...]
    interval_s: float
    save_s: float
    every: dict[str, int]
    lag_s: dict[str, float]
    restore_s: dict[str, float]
    final_save_s: float
    startup_cold_s: float
    startup_warm_s: float
    spares_warm: bool
    state_bytes: float
    node_bytes: float
    # warm startup by mode, teardown and communicator rebuild included
    startup_by_mode: dict[str, float] = field(default_factory=dict)
    fallback_probability: float = 0.0
    sigterm_durable: bool = False  # the save on SIGTERM goes to durable storage


def parse_recovery(value: Any, path: str) -> RecoveryCfg | None:
    """The ``recovery`` block, validated (errors name the field); None when absent."""
    if value is None:
        return None
    data = mapping(value, path)
    only_keys(data, path, RECOVERY_KEYS)
    raw = get(data, "tiers", list(TIER_ORDER))
    items = raw.split("+") if isinstance(raw, str) else raw
    tpath = join(path, "tiers")
    if not isinstance(items, list) or not items:
        raise ScenarioError(tpath, "must be a non-empty list of memory, peer, durable")
    for item in items:
        if item not in TIER_ORDER:
            raise ScenarioError(tpath, f"unknown tier {item!r}: memory, peer or durable")
    tiers = tuple(t for t in TIER_ORDER if t in items)
    if Tier.DURABLE.value not in tiers:
        raise ScenarioError(tpath, "durable is required (the fallback every mode can reach)")
    if Tier.PEER.value in tiers and Tier.MEMORY.value not in tiers:
        raise ScenarioError(tpath, "peer needs memory (the peer copy is sent from the snapshot)")
    mode = text(get(data, "mode", "auto"), join(path, "mode"))
    if mode not in MODES:
        raise ScenarioError(join(path, "mode"), f"must be one of {', '.join(MODES)}, "
                                                f"got {mode!r}")
    spares = text(get(data, "spares", "warm"), join(path, "spares"))
    if spares not in ("warm", "cold"):
        raise ScenarioError(join(path, "spares"), f"must be warm or cold, got {spares!r}")
    sigterm = text(get(data, "sigterm_save", "memory"), join(path, "sigterm_save"))
    if sigterm not in ("memory", "durable"):
        raise ScenarioError(join(path, "sigterm_save"),
                            f"must be memory or durable, got {sigterm!r}")
    mins = data.get("min_replicas")

    def rate(key: str, default: float) -> float:
        raw_v = get(data, key, default)
        if isinstance(raw_v, str):  # YAML reads 405e9 as text (number() names a bad one)
            with contextlib.suppress(ValueError):
                raw_v = float(raw_v)
        v = number(raw_v, join(path, key), low=0.0)
        if v <= 0:
            raise ScenarioError(join(path, key), "must be positive (GB/s)")
        return v

    def every(key: str, default: float) -> float:
        v = duration(get(data, key, default), join(path, key))
        if v <= 0:
            raise ScenarioError(join(path, key), "must be positive")
        return v

    def share(key: str, default: float) -> float:
        return number(get(data, key, default), join(path, key), low=0.0, high=1.0)

    def seconds(key: str, default: float) -> float:
        return duration(get(data, key, default), join(path, key))

    causes = get(data, "recur_causes", list(DEFAULT_RECUR_CAUSES))
    if not isinstance(causes, list) or not all(isinstance(c, str) for c in causes):
        raise ScenarioError(join(path, "recur_causes"), "must be a list of cause names")
    memory_every = every("memory_every", DEFAULT_MEMORY_EVERY_S)
    durable_every = data.get("durable_every")
    storage = parse_durable_storage(data.get("durable_storage"), join(path, "durable_storage"))
    return RecoveryCfg(
        tiers=tiers, mode=mode,
        min_replicas=None if mins is None else integer(mins, join(path, "min_replicas"), low=1),
        parameters=rate("parameters", DEFAULT_PARAMETERS),
        bytes_per_parameter=rate("bytes_per_parameter", DEFAULT_BYTES_PER_PARAMETER),
        memory_gb_s=rate("memory_gb_s", DEFAULT_MEMORY_GB_S),
        peer_gb_s=rate("peer_gb_s", DEFAULT_PEER_GB_S),
        durable_gb_s=storage.save_gb_s if storage else rate("durable_gb_s",
                                                             DEFAULT_DURABLE_GB_S),
        durable_restore_gb_s=storage.restore_gb_s if storage else None,
        durable_storage=storage,
        memory_every_s=memory_every,
        peer_every_s=every("peer_every", memory_every),
        durable_every_s=None if durable_every is None else every("durable_every", 0.0),
        startup_warm_s=seconds("startup_warm", DEFAULT_STARTUP_WARM_S),
        spares_warm=spares == "warm",
        startup_hot_swap_s=seconds("startup_hot_swap", DEFAULT_STARTUP_HOT_SWAP_S),
        startup_scale_down_s=seconds("startup_scale_down", DEFAULT_STARTUP_SCALE_DOWN_S),
        rebuild_s_per_kgpu=number(get(data, "rebuild_s_per_kgpu", DEFAULT_REBUILD_S_PER_KGPU),
                                  join(path, "rebuild_s_per_kgpu"), low=0.0),
        largest_rank_gb=number(get(data, "largest_rank_gb", DEFAULT_LARGEST_RANK_GB),
                               join(path, "largest_rank_gb"), low=0.0),
        copy_interference=share("copy_interference", DEFAULT_COPY_INTERFERENCE),
        fallback_probability=share("fallback_probability", DEFAULT_FALLBACK_PROBABILITY),
        recur_probability=share("recur_probability", DEFAULT_RECUR_PROBABILITY),
        recur_after_s=seconds("recur_after", DEFAULT_RECUR_AFTER_S),
        recur_fixed_after_s=seconds("recur_fixed_after", DEFAULT_RECUR_FIXED_AFTER_S),
        recur_causes=tuple(causes),
        sigterm_save=sigterm,
        report_before_exit_s=seconds("report_before_exit", 1.0),
    )


def check_recovery(cfg: RecoveryCfg | None, jobs: tuple[JobCfg, ...], events: str) -> None:
    """What the block asks of the rest of the scenario."""
    if cfg is None:
        return
    if cfg.tiers != (Tier.DURABLE.value,) and events != "latest":
        raise ScenarioError("recovery.tiers", "tiers other than durable need "
                                              "checkpoint_events: latest")
    for i, job in enumerate(jobs):
        if cfg.min_replicas is not None and cfg.min_replicas > job.nodes:
            raise ScenarioError("recovery.min_replicas",
                                f"job {job.name!r} has {job.nodes} nodes, fewer than "
                                f"{cfg.min_replicas}")
        if cfg.memory_every_s < job.step_time_s:
            raise ScenarioError("recovery.memory_every",
                                f"must be at least one step ({job.step_time_s:g} s) of "
                                f"jobs.{i}")


def durable_only(cfg: RecoveryCfg, job: JobCfg, gpus_per_node: int) -> JobCfg:
    """With durable storage alone the job checkpoints as one without tiers, at these sizes
    and bandwidths: its save (synchronous, the whole write), restore and interval come from
    the block, and the twin runs the untiered job model with them (``SimJob.plan`` stays
    None)."""
    plan = plan_for(cfg, job, gpus_per_node)
    return replace(job, checkpoint_interval_s=plan.interval_s, checkpoint_save_s=plan.save_s,
                   checkpoint_restore_s=plan.restore_s[Tier.DURABLE.value])


def plan_for(cfg: RecoveryCfg, job: JobCfg, gpus_per_node: int) -> TierPlan:
    """The job's tiers in numbers (see :class:`TierPlan`)."""
    state = cfg.parameters * cfg.bytes_per_parameter
    gpus = job.nodes * gpus_per_node
    shard = state / gpus  # per GPU (fully sharded state: each rank holds 1/gpus of it)
    # the largest rank blocks every snapshot, and its node's copy is the last to arrive
    largest = max(shard, cfg.largest_rank_gb * GB)
    node_bytes = shard * (gpus_per_node - 1) + largest
    memory_s = largest / (cfg.memory_gb_s * GB)
    peer_s = node_bytes / (cfg.peer_gb_s * GB)
    durable_s = state / (cfg.durable_gb_s * GB)
    durable_read_s = state / ((cfg.durable_restore_gb_s or cfg.durable_gb_s) * GB)
    durable_every = cfg.durable_every_s if cfg.durable_every_s is not None \
        else job.checkpoint_interval_s
    tiers = cfg.tiers
    rebuild = cfg.rebuild_s_per_kgpu * gpus / 1000.0
    by_mode = {Mode.IN_PLACE.value: cfg.startup_warm_s + rebuild,
               Mode.HOT_SWAP.value: (cfg.startup_hot_swap_s or cfg.startup_warm_s) + rebuild,
               Mode.SCALE_DOWN.value: (cfg.startup_scale_down_s or cfg.startup_warm_s)
               + rebuild}
    restore = {Tier.MEMORY.value: memory_s, Tier.PEER.value: peer_s,
               Tier.DURABLE.value: durable_read_s}
    if Tier.MEMORY.value not in tiers:  # one synchronous save to durable
        return TierPlan(tiers, durable_every, durable_s, {Tier.DURABLE.value: 1},
                        {Tier.DURABLE.value: 0.0}, {Tier.DURABLE.value: durable_read_s},
                        durable_s, job.startup_s, cfg.startup_warm_s, cfg.spares_warm,
                        state, node_bytes, by_mode, cfg.fallback_probability, True)
    cycle = cfg.memory_every_s + memory_s
    every = {Tier.MEMORY.value: 1}
    lag = {Tier.MEMORY.value: 0.0}
    # an entry every k snapshots: as often as asked, never faster than its bandwidth
    if Tier.PEER.value in tiers:
        every[Tier.PEER.value] = max(1, math.ceil(max(cfg.peer_every_s, peer_s) / cycle - 1e-9))
        lag[Tier.PEER.value] = peer_s
    every[Tier.DURABLE.value] = max(1, math.ceil(max(durable_every, durable_s) / cycle - 1e-9))
    lag[Tier.DURABLE.value] = durable_s
    sigterm_durable = cfg.sigterm_save == Tier.DURABLE.value
    final = durable_s if sigterm_durable \
        else memory_s + (peer_s if Tier.PEER.value in tiers else durable_s)
    # the background copies slow the steps while they run: their share, per snapshot
    stolen = cfg.copy_interference * sum(lag[t] / every[t] for t in every if t != Tier.MEMORY.value)
    return TierPlan(tiers, cfg.memory_every_s, memory_s + stolen, every, lag,
                    {t: restore[t] for t in tiers}, final, job.startup_s, cfg.startup_warm_s,
                    cfg.spares_warm, state, node_bytes, by_mode, cfg.fallback_probability,
                    sigterm_durable)
