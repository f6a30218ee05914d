"""What a ``SlurmCompute`` is built with: one frozen settings object for every collaborator."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mtc_program.peer_store import DEFAULT_BUDGET_BYTES
from shared.adapters.compute.slurm.reservations import DeepCheckSpec
from shared.domain.storage import StorageFloor
from shared.probes.commands import Runner as ProbeRunner


@dataclass(frozen=True)
class SlurmSettings:
    """The adapter's settings, fixed at construction (``SlurmCompute``'s keyword arguments,
    resolved: the python found on PATH, the user-job partitions defaulted, the deep-check
    spec parsed)."""

    state_dir: Path
    partition: str | None
    allowed: tuple[str, ...] | None  # the Slurm nodes mtc may use (None: all)
    python: str
    agent_interval_s: float
    agent_probes: tuple[str, ...]
    agent_runner: ProbeRunner
    agent_command_timeout_s: float
    observe_interval_s: float
    provision_timeout_s: float
    repair_timeout_s: float
    retry_initial_s: float
    retry_max_s: float
    master_addr: str
    user_partitions: tuple[str, ...]  # where users' own sbatch jobs are adopted; () for none
    deep_check_spec: DeepCheckSpec
    deep_check_runner: ProbeRunner
    # when the shared file system of a job's files counts as full at a rank's exit
    storage_floor: StorageFloor = field(default_factory=StorageFloor)
    # each node's memory for the peer copies its peer store holds (the oldest go beyond it)
    peer_budget_bytes: int = DEFAULT_BUDGET_BYTES
    # warm processes (``warm``): the job's allocation outlives its attempts and a rank that
    # restarts in process goes on in its process; off: one batch job per attempt
    warm: bool = False
    park_s: float = 20.0  # how long a held process waits for the next attempt
    gang_grace_s: float = 30.0  # a rank failed: the others' time to hold before the scancel
