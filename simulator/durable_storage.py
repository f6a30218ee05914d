"""The durable tier as the cluster's storage: a job's durable save and restore bandwidth
derived from a Managed Lustre instance instead of given (``recovery.durable_gb_s``).

```yaml
recovery:
  durable_storage:
    lustre_mb_s_per_tib: 1000   # the instance's performance tier, MB/s per TiB
    capacity_tib: 1000          # its capacity (the tier's throughput scales with it)
    job_share: 1.0              # the job's share of the instance's throughput
    write_efficiency: 0.16      # share of the peak a checkpoint save reaches
    read_efficiency: 0.21       # share of the peak a checkpoint load reaches
```

save GB/s = tier x capacity x share x write efficiency; restore GB/s likewise with the read
efficiency. The tiers and each tier's capacity bounds are Managed Lustre's published ones
(``shared.domain.cluster_storage.TIERS``: the API refuses the same values); the tier's step
size is not checked here (a what-if may ask for any capacity in range). The efficiencies are a
504-GPU production report's measurements (arXiv 2605.09370: checkpoint loads at ~21% of peak
read bandwidth, saves at ~16% of peak write); the job's share defaults to the whole instance
(assumed: one job on its own file system).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.domain.cluster_storage import DYNAMIC_TIER, GIB_PER_TIB, TIERS
from simulator.readers import ScenarioError, get, join, mapping, number, only_keys

KEYS = ("lustre_mb_s_per_tib", "capacity_tib", "job_share", "write_efficiency",
        "read_efficiency")
DEFAULT_WRITE_EFFICIENCY = 0.16  # saves: ~16% of peak write (arXiv 2605.09370, 504 GPUs)
DEFAULT_READ_EFFICIENCY = 0.21  # loads: ~21% of peak read (the same report)
DEFAULT_JOB_SHARE = 1.0  # assumed: the job has the instance to itself


@dataclass(frozen=True)
class DurableStorageCfg:
    lustre_mb_s_per_tib: int
    capacity_tib: float
    job_share: float = DEFAULT_JOB_SHARE
    write_efficiency: float = DEFAULT_WRITE_EFFICIENCY
    read_efficiency: float = DEFAULT_READ_EFFICIENCY

    @property
    def peak_gb_s(self) -> float:
        """The instance's throughput, GB/s: its tier times its capacity."""
        return self.lustre_mb_s_per_tib * self.capacity_tib / 1000.0

    @property
    def save_gb_s(self) -> float:
        return self.peak_gb_s * self.job_share * self.write_efficiency

    @property
    def restore_gb_s(self) -> float:
        return self.peak_gb_s * self.job_share * self.read_efficiency


def parse_durable_storage(value: Any, path: str) -> DurableStorageCfg | None:
    """The block, validated (errors name the field); None when absent."""
    if value is None:
        return None
    data = mapping(value, path)
    only_keys(data, path, KEYS)
    where = join(path, "lustre_mb_s_per_tib")
    if "lustre_mb_s_per_tib" not in data:
        raise ScenarioError(where, "is required (125, 250, 500 or 1000)")
    tier = number(data["lustre_mb_s_per_tib"], where)
    if tier == DYNAMIC_TIER:
        raise ScenarioError(where, "the Dynamic tier's throughput follows the access pattern: "
                                   "no save time can be derived from it")
    if tier not in TIERS:
        raise ScenarioError(where, f"must be one of {', '.join(map(str, TIERS))}, got {tier:g}")
    low, high = TIERS[int(tier)]
    where = join(path, "capacity_tib")
    if "capacity_tib" not in data:
        raise ScenarioError(where, "is required")
    capacity = number(data["capacity_tib"], where, low=low / GIB_PER_TIB,
                      high=high / GIB_PER_TIB)

    def share(key: str, default: float) -> float:
        v = number(get(data, key, default), join(path, key), low=0.0, high=1.0)
        if v <= 0:
            raise ScenarioError(join(path, key), "must be positive")
        return v

    return DurableStorageCfg(int(tier), capacity, share("job_share", DEFAULT_JOB_SHARE),
                             share("write_efficiency", DEFAULT_WRITE_EFFICIENCY),
                             share("read_efficiency", DEFAULT_READ_EFFICIENCY))
