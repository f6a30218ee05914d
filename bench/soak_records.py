"""What the chaos soak records (its planned jobs, the violations, what it watches per node,
its figures) and what it reads of the machine itself (``/proc``, a file system's room).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.adapters.compute.disk_evidence import space
from shared.config import ControlPlaneConfig
from shared.domain import storage
from shared.domain.model import NodeState


def disk_full(path: str, floor: storage.StorageFloor | None = None) -> bool:
    """Whether the file system holding ``path`` is full now by the control plane's floor."""
    found = space(path)
    return found is not None and storage.full(*found, floor or ControlPlaneConfig().storage_floor)


@dataclass
class PlannedJob:
    job_id: str
    cluster_id: str
    replicas: int
    steps: int
    submit_at: float
    cancel_at: float | None
    submitted: bool = False
    restart_anyway: bool = False  # scheduling.restartJobOnWorkerRestart
    cancelled: bool = False  # cancel accepted while the job was live: CANCELLED expected
    killed: bool = False  # the soak SIGKILLed one of its workers (outside the control plane)
    signature: tuple[Any, ...] = ()
    changed_at: float = 0.0
    capacity_since: float | None = None
    final: str = ""


@dataclass
class Violation:
    at: float
    invariant: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"at_s": round(self.at, 1), "invariant": self.invariant, "detail": self.detail}


@dataclass
class ProcInfo:
    pid: int
    state: str
    pgid: int
    cmdline: str


@dataclass
class NodeWatch:
    last_state: NodeState | None = None
    last_in_service_since: float = 0.0
    last_fault_at: float = -math.inf  # a real fault injected by the soak
    last_stale_at: float = -math.inf  # a stale report or a replayed report aimed at it
    bad_count_since: float | None = None
    room_since: float | None = None  # held, and the guard has had room since


@dataclass
class Figures:
    faults: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    replays: Counter[str] = field(default_factory=Counter)
    chaos: Counter[str] = field(default_factory=Counter)
    controller_restarts: int = 0
    checks: int = 0
    checks_by_invariant: Counter[str] = field(default_factory=Counter)
    guard_holds: int = 0
    doc_samples: list[dict[str, Any]] = field(default_factory=list)


def proc_table() -> dict[int, list[ProcInfo]]:
    """Every live (non-zombie) process on this machine, by process group."""
    out: dict[int, list[ProcInfo]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            continue
        info = ProcInfo(int(entry.name), fields[0], int(fields[2]), cmd)
        out.setdefault(info.pgid, []).append(info)
    return out


def rank_pids(launcher: int, procs: dict[int, list[ProcInfo]]) -> list[ProcInfo]:
    """The rank's program: the launcher's group less the launcher."""
    return [p for p in procs.get(launcher, []) if p.pid != launcher]
