"""What one node of a job may use: processes and memory, from its pool's machine spec.

A job is given the machine it asked for and no more: its memory is the machine type's
(Compute Engine's published sizes: the accelerator-optimized types by name, the general
purpose ones by family from their vCPUs), its processes ``DEFAULT_PROCESSES`` per node, far
above what a training program starts (a rank, its data loader workers, its compiler
threads) and far below what takes a host down. The job's label ``mtc-max-processes``
lowers or raises that. An unknown machine type has no memory limit (0), never a guessed one.

Sources: https://cloud.google.com/compute/docs/gpus (A3, A2, G2 sizes) and
https://cloud.google.com/compute/docs/general-purpose-machines (GB per vCPU by family).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

GIB = 1 << 30
DEFAULT_PROCESSES = 32_768
PROCESSES_LABEL = "mtc-max-processes"
MIN_PROCESSES, MAX_PROCESSES = 16, 4_194_304  # the kernel's pid_max ceiling

MEMORY_GB: Mapping[str, int] = {
    "a3-ultragpu-8g": 2952, "a3-megagpu-8g": 1872, "a3-highgpu-8g": 1872,
    "a3-edgegpu-8g": 1872, "a3-highgpu-4g": 936, "a3-highgpu-2g": 468, "a3-highgpu-1g": 234,
    "a2-ultragpu-8g": 1360, "a2-ultragpu-4g": 680, "a2-ultragpu-2g": 340,
    "a2-ultragpu-1g": 170, "a2-megagpu-16g": 1360, "a2-highgpu-8g": 680,
    "a2-highgpu-4g": 340, "a2-highgpu-2g": 170, "a2-highgpu-1g": 85,
}
# general purpose types: GB per vCPU by shape (n1's standard is 3.75)
GB_PER_VCPU: Mapping[tuple[str, str], float] = {
    ("n1", "standard"): 3.75, ("n1", "highmem"): 6.5, ("n1", "highcpu"): 0.9,
    ("n2", "standard"): 4, ("n2", "highmem"): 8, ("n2", "highcpu"): 1,
    ("n2d", "standard"): 4, ("n2d", "highmem"): 8, ("n2d", "highcpu"): 1,
    ("e2", "standard"): 4, ("e2", "highmem"): 8, ("e2", "highcpu"): 1,
    ("c2", "standard"): 4, ("c3", "standard"): 4, ("c3", "highmem"): 8, ("c3", "highcpu"): 2,
    ("g2", "standard"): 4,
}
_GENERAL = re.compile(r"^([a-z][0-9a-z]*)-(standard|highmem|highcpu)-(\d+)$")


@dataclass(frozen=True)
class NodeLimits:
    processes: int
    memory_bytes: int  # 0: no limit


def machine_memory_bytes(machine_type: str) -> int:
    """The machine type's memory, or 0 where it is not known."""
    if machine_type in MEMORY_GB:
        return MEMORY_GB[machine_type] * GIB
    m = _GENERAL.match(machine_type)
    if m is None or (m.group(1), m.group(2)) not in GB_PER_VCPU:
        return 0
    return int(GB_PER_VCPU[(m.group(1), m.group(2))] * int(m.group(3)) * GIB)


def label_errors(labels: Mapping[str, str]) -> list[tuple[str, str]]:
    """(field, message) for a limit label a spec gets wrong (callers answer 400)."""
    raw = labels.get(PROCESSES_LABEL)
    if raw is not None and not (raw.isdigit() and MIN_PROCESSES <= int(raw) <= MAX_PROCESSES):
        return [(f"labels.{PROCESSES_LABEL}",
                 f"must be a whole number of processes from {MIN_PROCESSES} to {MAX_PROCESSES}")]
    return []


def node_limits(machine_type: str, labels: Mapping[str, str]) -> NodeLimits:
    """One node's limits; a label that is not a number in range leaves the default."""
    processes = DEFAULT_PROCESSES
    raw = labels.get(PROCESSES_LABEL, "")
    if raw.isdigit() and MIN_PROCESSES <= int(raw) <= MAX_PROCESSES:
        processes = int(raw)
    return NodeLimits(processes, machine_memory_bytes(machine_type))
