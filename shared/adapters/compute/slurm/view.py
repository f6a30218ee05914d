"""The adapter's last observation of Slurm, held by ``SlurmCompute`` and read by each of its
collaborators (they are given the same object)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.adapters.compute.slurm.api import NodeRecord
from shared.adapters.compute.slurm.cli import SlurmJob


@dataclass
class SlurmView:
    """``sinfo``/``squeue`` as last read, and whether slurmctld answers. While it does not
    (``down_since``), nothing is inferred from missing answers, and timeouts do not run."""

    up_since: float  # timeouts count from here at the earliest (the end of the last outage)
    records: dict[str, NodeRecord] = field(default_factory=dict)
    jobs: dict[int, SlurmJob] = field(default_factory=dict)
    observed_at: float = float("-inf")
    fresh: bool = False  # the last observation succeeded
    down_since: float | None = None  # slurmctld unreachable since
    partition_ready: bool = False

    def waited(self, since: float, now: float) -> float:
        """How long something has waited for Slurm, not counting the last outage: a reboot
        that could not be checked on while slurmctld was down has not timed out."""
        return now - max(since, self.up_since)
