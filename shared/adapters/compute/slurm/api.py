"""What the Slurm adapter reads and asks of Slurm: node records, the commands it uses, names.

The commands are Slurm 22.05's (https://slurm.schedmd.com/scontrol.html,
https://slurm.schedmd.com/sbatch.html, https://slurm.schedmd.com/sinfo.html); ``SlurmCli``
runs them under timeouts and sorts their errors into transient and permanent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shared.adapters.compute.slurm.cli import SlurmJob, SlurmNode
from shared.adapters.compute.slurm.reservations import ReservationCli, Reservations
from shared.domain.health import RepairAction

RA = RepairAction
REBOOTS = frozenset({RA.RESET_GPU, RA.REBOOT, RA.REIMAGE})
EXIT_SUBMIT_FAILED = 1
TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)
REQUEUED_JOB_STATES = frozenset({"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# slurmd not running or not answering: the node's agent is silent, nothing can run there
NOT_UP_FLAGS = frozenset(
    {"NOT_RESPONDING", "POWERED_DOWN", "POWERING_UP", "POWERING_DOWN", "POWER_DOWN", "REBOOT_ISSUED"}
)
NOT_UP_STATES = frozenset({"down", "unknown", "future", "error"})
DEFAULT_XID_LINE = "NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name={name}, {text}"
XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted",
}



# --------------------------------------------------------------------------- Slurm side


@dataclass(frozen=True)
class NodeRecord:
    """A Slurm node as ``sinfo --json`` shows it, with the slurmd start time (a reboot
    changes it), which ``SlurmNode`` does not carry."""

    node: SlurmNode
    slurmd_start_time: int = 0

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.node.state_flags)

    @property
    def cloud(self) -> bool:
        return "CLOUD" in self.flags

    @property
    def up(self) -> bool:
        """slurmd registered and answering (drained or busy counts as up)."""
        return self.node.state not in NOT_UP_STATES and not self.flags & NOT_UP_FLAGS

    @property
    def rebooting(self) -> bool:
        return bool(self.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED"})


def _plain_int(value: Any) -> int:
    if isinstance(value, Mapping):  # Slurm >= 23.02: {"set": true, "number": N}
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return int(value)


class SlurmControl(ReservationCli):
    """``SlurmCli`` as this adapter reads it: node records carry the slurmd start time, a
    repair reboot keeps the node drained until mtc's own checks pass, and deep checks run in
    maintenance reservations (``reservations``)."""

    def node_records(self) -> list[NodeRecord]:
        return [NodeRecord(n, n.slurmd_start_time) for n in self.nodes()]

    def reboot_keep_drain(self, node: str, reason: str) -> None:
        self.reboot(node, reason, keep_drained=True)


class SlurmApi(Reservations, Protocol):
    """What SlurmCompute uses of Slurm (``SlurmControl``; unit tests pass a fake), the
    maintenance reservations of its deep checks included."""

    def node_records(self) -> list[NodeRecord]: ...
    def jobs(self) -> list[SlurmJob]: ...
    def drain(self, node: str, reason: str) -> None: ...
    def resume(self, node: str) -> None: ...
    def reboot_keep_drain(self, node: str, reason: str) -> None: ...
    def power_up(self, node: str) -> None: ...
    def power_down(self, node: str) -> None: ...
    def ensure_partition(self, name: str, nodes: str = "ALL") -> None: ...
    def signal_job(self, job_id: int, signal: str = "TERM", full: bool = False) -> None: ...
    def cancel(self, job_id: int) -> None: ...
    def requeue(self, job_id: int) -> None: ...
    def start_now(self, job_id: int) -> None: ...
    def submit(
        self,
        script_path: str,
        *,
        nodes: int,
        job_name: str,
        env: Mapping[str, str] | None = None,
        requeue: bool = True,
        open_mode: str = "append",
        output: str | None = None,
        partition: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> int: ...


def job_name(job_id: str, attempt: int, instance: str) -> str:
    """The Slurm job name of an mtc attempt; also how a lost sbatch answer is found again.
    ``instance`` tells apart control planes (state dirs) sharing one Slurm cluster."""
    return f"mtc-{job_id}-a{attempt}-{instance}"


def xid_line(
    xid: int, *, pci: str = "0000:3b:00", pid: int = 4242, name: str = "python3", text: str | None = None
) -> str:
    """One kernel log line in the NVIDIA driver's format (what ``inject_xid`` appends)."""
    body = text or XID_TEXT.get(xid, "injected by mtc")
    return DEFAULT_XID_LINE.format(pci=pci, xid=xid, pid=pid, name=name, text=body) + "\n"




MTC_REASON_PREFIX = "mtc: "
MTC_REASON_PREFIXES = ("mtc:", "mtc-agent ")  # mtc's drains, and its node agent's (HealthCheckProgram)


def drain_reason(text: str) -> str:
    """A Slurm drain reason: one line, prefixed ``mtc: `` so people (and mtc) see who drained
    the node."""
    flat = " ".join(text.split())
    return (flat if flat.startswith(MTC_REASON_PREFIX) else MTC_REASON_PREFIX + flat)[:200]


def mtc_reason(reason: str) -> bool:
    """Whether a node's Slurm reason is one mtc wrote (only those drains are mtc's to undo)."""
    return reason.startswith(MTC_REASON_PREFIXES)


DRAINED_BY_OPERATOR = "DrainedByOperator"
RESUMED_BY_OPERATOR = "ResumedByOperator"


def foreign_reason(record: NodeRecord | None) -> str | None:
    """The reason of a drain someone other than mtc made, or None. A drain with no reason is
    not an operator's (``scontrol`` refuses to drain without one): Slurm leaves such a DRAIN
    on a power-saving node it powered up after mtc drained it."""
    if record is None or not record.node.drained or not record.node.reason:
        return None
    return None if mtc_reason(record.node.reason) else record.node.reason


def operator_condition(slurm_node: str, reason: str | None, since: float) -> dict[str, Any]:
    """The ``DrainedByOperator`` condition: TRUE with the operator's reason, FALSE once lifted."""
    text = (f"Slurm node {slurm_node} drained by an operator: {reason}" if reason is not None
            else f"Slurm node {slurm_node}: the operator's drain was lifted")
    return {"type": DRAINED_BY_OPERATOR, "status": "true" if reason is not None else "false",
            "reason": text, "since": since,
            "details": {"slurm_node": slurm_node, "slurm_reason": reason or ""}}
