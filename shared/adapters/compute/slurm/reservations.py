"""Deep checks on a Slurm node, run inside a maintenance reservation.

Why a reservation: a node being checked (DCGM level 3 takes tens of minutes, the collective
test stresses the network) must run nothing else, and must not be handed to a job halfway;
``scontrol create reservation flags=maint`` takes the node (and the peer the collective test
needs) out of scheduling for the duration, shows everyone why (``scontrol show
reservation``), and is deleted when the checks end, whatever their result, so the node
leaves the reservation exactly when the checks are over. The checks run on the node with
``srun --reservation=...`` (so they reach the node's own GPUs and network):

- ``dcgmi diag -r 3 -j`` on the node (``shared.probes.dcgm``), and
- ``all_reduce_perf`` across the node and its peers (``shared.probes.nccl``; bus bandwidth at
  the largest size against ``min_busbw_gbps``).

A tool missing on the node (srun: "execve(): dcgmi: No such file or directory"), a reservation
that cannot be made, or no idle peer gives ``unknown`` for that check, never a pass.

This module is how one check runs (``run_deep_check``); ``deep_checks.SlurmDeepChecks``
is when: one run per (node, attempt), in a worker thread, resumed after a restart.
"""

from __future__ import annotations

import getpass
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Protocol

from shared.adapters.compute.slurm.cli import SlurmCli, SlurmError, expand_hostlist
from shared.domain.errors import ValidationError
from shared.domain.health import Condition, ConditionType
from shared.probes import dcgm, nccl
from shared.probes.commands import CommandResult, ProbeError, ToolNotFound
from shared.probes.commands import Runner as ProbeRunner
from shared.probes.conditions import unknown

log = logging.getLogger("mtc.slurm.deep_checks")

DCGM_TYPE = ConditionType.DCGM_DIAG_FAILED.value
BANDWIDTH_TYPE = ConditionType.COLLECTIVE_BANDWIDTH_LOW.value
EXECVE_MISSING = re.compile(r"execve\(\): ([^:]+): No such file or directory")


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]
    flags: tuple[str, ...]
    state: str


class ReservationCli(SlurmCli):
    """``scontrol`` reservation commands (Slurm 22.05), idempotent."""

    def create_maint_reservation(self, name: str, nodes: Sequence[str], minutes: int,
                                 user: str) -> None:
        """Reserve ``nodes`` now, for ``minutes``, in maintenance mode; an existing
        reservation of that name (a retry after a crash) is kept."""
        argv = ["scontrol", "create", "reservation", f"ReservationName={name}",
                "StartTime=now", f"Duration={int(minutes)}", f"Nodes={','.join(nodes)}",
                "Flags=MAINT,IGNORE_JOBS", f"Users={user}"]
        result = self._invoke(argv)
        text = f"{result.stdout} {result.stderr}"
        if result.returncode != 0 and "Duplicate reservation name" not in text:
            self._check(argv)  # raises, classified

    def reservation(self, name: str) -> Reservation | None:
        result = self._invoke(["scontrol", "show", "reservation", name])
        if result.returncode != 0:
            if "not found" in f"{result.stdout} {result.stderr}":
                return None
            self._check(["scontrol", "show", "reservation", name])  # raises
        return parse_reservation(result.stdout)

    def delete_reservation(self, name: str) -> None:
        argv = ["scontrol", "delete", f"ReservationName={name}"]
        result = self._invoke(argv)
        if result.returncode != 0 and "reservation is invalid" not in \
                f"{result.stdout} {result.stderr}":
            self._check(argv)


def parse_reservation(text: str) -> Reservation | None:
    """``scontrol show reservation NAME`` (key=value pairs over several lines)."""
    fields = dict(tok.split("=", 1) for tok in text.split() if "=" in tok)
    if "ReservationName" not in fields:
        return None
    nodes = fields.get("Nodes", "")
    return Reservation(fields["ReservationName"],
                       expand_hostlist(nodes) if nodes and nodes != "(null)" else (),
                       tuple(f for f in fields.get("Flags", "").split(",") if f),
                       fields.get("State", ""))


class Reservations(Protocol):
    """What the deep checks use of Slurm (``ReservationCli``; unit tests pass a fake)."""

    def create_maint_reservation(self, name: str, nodes: Sequence[str], minutes: int,
                                 user: str) -> None: ...
    def delete_reservation(self, name: str) -> None: ...


@dataclass(frozen=True)
class DeepCheckSpec:
    """How deep checks run; ``min_busbw_gbps`` None makes the collective test unknown."""

    dcgm_level: int = 3
    dcgmi: str = "dcgmi"
    dcgm_timeout_s: float = 3600.0
    nccl_argv: tuple[str, ...] = ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1")
    nccl_timeout_s: float = 1200.0
    min_busbw_gbps: float | None = None
    tasks_per_node: int = 8  # one rank per GPU
    peers: int = 1
    reservation_minutes: int = 180
    user: str = ""  # the reservation's user: "" = the user mtc runs as
    slurm_conf: str | None = None

    def __post_init__(self) -> None:
        if self.dcgm_level not in (2, 3, 4):
            raise ValidationError("deep_check_spec.dcgm_level", "must be 2, 3 or 4")
        for name in ("dcgm_timeout_s", "nccl_timeout_s", "tasks_per_node",
                     "reservation_minutes"):
            if getattr(self, name) <= 0:
                raise ValidationError(f"deep_check_spec.{name}", "must be positive")
        if self.min_busbw_gbps is not None and self.min_busbw_gbps <= 0:
            raise ValidationError("deep_check_spec.min_busbw_gbps", "must be positive")
        if self.peers < 0:
            raise ValidationError("deep_check_spec.peers", "must not be negative")
        if not self.nccl_argv:
            raise ValidationError("deep_check_spec.nccl_argv", "must name the test to run")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeepCheckSpec:
        """From plain data (a JSON compute option); an unknown key is refused, naming it."""
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ValidationError(f"deep_check_spec.{extra[0]}", "unknown key")
        values = dict(data)
        if "nccl_argv" in values:
            argv = values["nccl_argv"]
            if not isinstance(argv, list | tuple) or not all(isinstance(a, str) for a in argv):
                raise ValidationError("deep_check_spec.nccl_argv", "must be a list of strings")
            values["nccl_argv"] = tuple(argv)
        return cls(**values)


def reservation_name(slurm_node: str, attempt: int) -> str:
    return f"mtc-deep-{slurm_node}-a{attempt}"


@contextmanager
def maintenance(cli: Reservations, name: str, nodes: Sequence[str], spec: DeepCheckSpec
                ) -> Iterator[None]:
    """The nodes sit in the maintenance reservation exactly while the block runs."""
    cli.create_maint_reservation(name, nodes, spec.reservation_minutes,
                                 spec.user or getpass.getuser())
    try:
        yield
    finally:
        try:
            cli.delete_reservation(name)
        except SlurmError as exc:  # it ends by itself at its end time; say so
            log.error("could not delete reservation %s (ends by itself): %s", name, exc)


def srun_runner(base: ProbeRunner, reservation: str, nodes: Sequence[str], tasks_per_node: int,
                slurm_conf: str | None = None) -> ProbeRunner:
    """Run a probe's argv on ``nodes`` through srun in the reservation; a tool missing on a
    node is ToolNotFound (the probe says unknown), not a failed check."""
    prefix = ["env", f"SLURM_CONF={slurm_conf}"] if slurm_conf else []

    def run(argv: Sequence[str], timeout_s: float) -> CommandResult:
        full = [*prefix, "srun", f"--reservation={reservation}", f"--nodelist={','.join(nodes)}",
                f"--nodes={len(nodes)}", f"--ntasks-per-node={tasks_per_node}",
                "--kill-on-bad-exit=1", f"--time={max(1, int(timeout_s // 60) + 1)}", *argv]
        result = base(full, timeout_s)
        missing = EXECVE_MISSING.search(result.stderr)
        if result.returncode != 0 and missing:
            raise ToolNotFound(f"{missing.group(1)} not found on {','.join(nodes)}")
        return result

    return run


def run_deep_check(cli: Reservations, slurm_node: str, peers: Sequence[str], attempt: int,
                   spec: DeepCheckSpec, runner: ProbeRunner, now: Callable[[], float]
                   ) -> tuple[dict[str, Any], ...]:
    """Reserve, run DCGM and the collective test, release; the conditions, tagged."""
    name = reservation_name(slurm_node, attempt)
    nodes = (slurm_node, *peers[: spec.peers])
    try:
        with maintenance(cli, name, nodes, spec):
            dcgm_cond = _guard(DCGM_TYPE, now, lambda: dcgm.probe(
                srun_runner(runner, name, (slurm_node,), 1, spec.slurm_conf), now(),
                tool=spec.dcgmi, level=spec.dcgm_level, timeout_s=spec.dcgm_timeout_s))
            if len(nodes) < 2:
                bw = unknown(BANDWIDTH_TYPE, now(), "no idle peer for the collective test")
            else:
                bw = _guard(BANDWIDTH_TYPE, now, lambda: nccl.probe(
                    srun_runner(runner, name, nodes, spec.tasks_per_node, spec.slurm_conf),
                    now(), spec.nccl_argv, min_busbw_gbps=spec.min_busbw_gbps,
                    timeout_s=spec.nccl_timeout_s, nodes=nodes))
    except Exception as exc:  # the checks could not run at all: unknown, and say why
        if not isinstance(exc, SlurmError):
            log.exception("deep checks of %s failed to run", slurm_node)
        reason = f"deep checks could not reserve {','.join(nodes)}: {exc}"[:300]
        dcgm_cond = unknown(DCGM_TYPE, now(), reason)
        bw = unknown(BANDWIDTH_TYPE, now(), reason)
    return tuple({**c.to_dict(), "details": {**c.details, "deep_check_attempt": attempt,
                                             "reservation": name}}
                 for c in (dcgm_cond, bw))


def _guard(ctype: str, now: Callable[[], float], probe: Callable[[], Condition]) -> Condition:
    try:
        return probe()
    except ProbeError as exc:
        return unknown(ctype, now(), exc.reason)
    except Exception as exc:  # a bug must not leave the node pending for ever
        log.exception("deep check %s crashed", ctype)
        return unknown(ctype, now(), f"deep check crashed: {type(exc).__name__}: {exc}"[:300])
