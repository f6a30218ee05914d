"""An in-memory Slurm for SlurmCompute's unit tests: the ``SlurmApi`` surface, with the
behaviour the adapter relies on (Slurm 22.05 as seen on the real cluster in
tests/integration/slurm): ``resume`` of a node that is not drained is refused, a reboot
keeps DRAIN, power-saving nodes come up and go down on request, and while ``down`` every
call fails the way an unreachable slurmctld does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.adapters.compute.slurm.api import NodeRecord
from shared.adapters.compute.slurm.cli import SlurmJob, SlurmNode, SlurmPermanentError, SlurmTransientError


@dataclass
class FakeNode:
    name: str
    state: str = "idle"
    flags: set[str] = field(default_factory=set)
    reason: str = ""
    start_time: int = 1000

    def record(self) -> NodeRecord:
        order = sorted(self.flags)
        return NodeRecord(SlurmNode(self.name, self.state, tuple(order), self.reason), self.start_time)


@dataclass
class FakeJob:
    job_id: int
    name: str
    nodes: tuple[str, ...]
    state: str = "RUNNING"
    restart_cnt: int = 0
    argv: dict[str, Any] = field(default_factory=dict)
    partition: str = ""
    requeue: bool = True
    exit_code: int | None = None  # a wait status, as squeue --json gives it
    comment: str = ""
    work_dir: str = ""

    def record(self) -> SlurmJob:
        return SlurmJob(self.job_id, self.name, self.state, ",".join(self.nodes), self.restart_cnt,
                        self.requeue, partition=self.partition, exit_code=self.exit_code,
                        comment=self.comment, work_dir=self.work_dir, user="alice",
                        command="/home/alice/job.sh")


class FakeSlurm:
    def __init__(self, static: Sequence[str] = ("n1", "n2", "n3", "n4"), cloud: Sequence[str] = ("c1", "c2")):
        self.nodes = {n: FakeNode(n) for n in static}
        self.nodes.update({n: FakeNode(n, flags={"CLOUD", "POWERED_DOWN"}, start_time=0) for n in cloud})
        self.queue: dict[int, FakeJob] = {}
        self.calls: list[tuple[str, ...]] = []
        self.down = False
        self.partitions: dict[str, str] = {}
        self.reservations: dict[str, tuple[str, ...]] = {}
        self._next_job = 100

    # -- helpers for tests

    def _call(self, *what: str) -> None:
        self.calls.append(what)
        if self.down:
            raise SlurmTransientError(f"{what[0]}: Unable to contact slurm controller (connect failure)")

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)

    def finish_reboot(self, name: str) -> None:
        node = self.nodes[name]
        node.flags -= {"REBOOT_REQUESTED", "REBOOT_ISSUED"}
        node.start_time += 10

    def _node(self, name: str) -> FakeNode:
        if name not in self.nodes:
            raise SlurmPermanentError(f"Invalid node name specified: {name}")
        return self.nodes[name]

    # -- SlurmApi

    def node_records(self) -> list[NodeRecord]:
        self._call("sinfo")
        return [n.record() for n in self.nodes.values()]

    def jobs(self) -> list[SlurmJob]:
        self._call("squeue")
        return [j.record() for j in self.queue.values()]

    def drain(self, node: str, reason: str) -> None:
        self._call("drain", node, reason)
        n = self._node(node)
        n.flags.add("DRAIN")
        n.reason = reason

    def resume(self, node: str) -> None:
        self._call("resume", node)
        n = self._node(node)
        if "DRAIN" not in n.flags:
            raise SlurmPermanentError("slurm_update error: Invalid node state specified")
        n.flags.discard("DRAIN")
        n.reason = ""

    def reboot_keep_drain(self, node: str, reason: str) -> None:
        self._call("reboot", node, reason)
        n = self._node(node)
        n.flags.add("REBOOT_REQUESTED")
        n.reason = reason

    def power_up(self, node: str) -> None:
        self._call("power_up", node)
        n = self._node(node)
        n.flags.discard("POWERED_DOWN")
        n.start_time = 5000

    def power_down(self, node: str) -> None:
        self._call("power_down", node)
        self._node(node).flags.add("POWERED_DOWN")

    def ensure_partition(self, name: str, nodes: str = "ALL") -> None:
        self._call("partition", name, nodes)
        self.partitions[name] = nodes

    def create_maint_reservation(self, name: str, nodes: Sequence[str], minutes: int,
                                 user: str) -> None:
        self._call("reserve", name, ",".join(nodes))
        self.reservations.setdefault(name, tuple(nodes))

    def delete_reservation(self, name: str) -> None:
        self._call("unreserve", name)
        self.reservations.pop(name, None)

    def signal_job(self, job_id: int, signal: str = "TERM", full: bool = False) -> None:
        self._call("signal", str(job_id), signal)
        if job_id not in self.queue:
            raise SlurmPermanentError("Invalid job id specified")

    def requeue(self, job_id: int) -> None:
        """As Slurm 22.05 does: back to PENDING, one more restart, the exit code cleared."""
        self._call("requeue", str(job_id))
        if job_id not in self.queue:
            raise SlurmPermanentError("Invalid job id specified")
        job = self.queue[job_id]
        job.state, job.restart_cnt, job.exit_code, job.nodes = "PENDING", job.restart_cnt + 1, 0, ()

    def start_now(self, job_id: int) -> None:
        self._call("start_now", str(job_id))
        if self.queue.get(job_id) is None or self.queue[job_id].state != "PENDING":
            raise SlurmPermanentError("Job is no longer pending execution")

    def user_job(self, nodes: Sequence[str], *, partition: str = "mtc", name: str = "train",
                 **kw: Any) -> FakeJob:
        """A job a user submitted with plain sbatch, already running on ``nodes``."""
        self._next_job += 1
        job = FakeJob(self._next_job, name, tuple(nodes), partition=partition, **kw)
        self.queue[job.job_id] = job
        return job

    def cancel(self, job_id: int) -> None:
        self._call("cancel", str(job_id))
        if job_id not in self.queue:
            raise SlurmPermanentError("Invalid job id specified")
        self.queue[job_id].state = "CANCELLED"

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
    ) -> int:
        self._call("sbatch", job_name)
        nodelist = next(a for a in extra_args if a.startswith("--nodelist=")).split("=", 1)[1]
        self._next_job += 1
        self.queue[self._next_job] = FakeJob(
            self._next_job,
            job_name,
            tuple(nodelist.split(",")),
            argv={
                "script": script_path,
                "nodes": nodes,
                "requeue": requeue,
                "open_mode": open_mode,
                "output": output,
                "partition": partition,
                "extra": list(extra_args),
            },
        )
        return self._next_job
