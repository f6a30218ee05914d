"""A thin, typed client for the Slurm command-line tools (no control-plane logic).

Reads go through ``sinfo --json`` / ``squeue --json`` and are parsed by key, never by column
position. Writes go through ``scontrol``, ``scancel`` and ``sbatch`` (slurmrestd v0.0.38 cannot
update nodes). Every command runs under a timeout, and every failure is classified:

* ``SlurmTransientError`` (a ``TransientError``): the controller is unreachable or slow
  (timeouts, "Unable to contact slurm controller", "Socket timed out"...). Retrying helps.
* ``SlurmPermanentError`` (a ``PermanentError``): the request itself is wrong ("Invalid node
  name specified", "Invalid job id specified"...). Retrying cannot help.

Errors that match neither list are permanent, so an unexpected message is dead-lettered with its
text instead of being retried forever. Note that on Slurm 22.05 ``sinfo --json`` exits 0 when
the controller is down and reports it in the JSON ``errors`` list, which is checked too.

The runner is injected so unit tests replay recorded outputs.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shared.adapters.compute.job_env import host_env
from shared.domain.errors import MtcError, PermanentError, TransientError


class SlurmError(MtcError):
    """Base of both Slurm errors; carries the command and what it printed."""

    def __init__(
        self,
        message: str,
        *,
        argv: Sequence[str] = (),
        returncode: int | None = None,
        output: str = "",
    ) -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        self.returncode = returncode
        self.output = output


class SlurmTransientError(SlurmError, TransientError):
    """The controller could not be reached or answered too slowly: retry later."""


class SlurmPermanentError(SlurmError, PermanentError):
    """Slurm rejected the request (bad node, bad job id, bad state): do not retry."""


_TRANSIENT_PATTERNS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connect failure",
    "communication connection failure",
    "zero bytes were transmitted or received",
    "unexpected message received",
    "slurm backup controller in standby mode",
    "resource temporarily unavailable",
    "slurmctld is not responding",
    "transport endpoint is not connected",
    "unable to connect",
    "failed while looking for",  # sinfo/squeue --json when slurmctld cannot be reached
    "unspecified error",
)
_PERMANENT_PATTERNS = (
    "invalid node name",
    "invalid job id",
    "invalid node state",
    "invalid user",
    "invalid partition",
    "unable to open file",
    "requested node configuration is not available",
    "access/permission denied",
    "permission denied",
    "you must specify a reason",
    "job is no longer pending",
    "only batch jobs",
    "already completing or completed",
    "reboot program not set",
)


def classify(text: str) -> type[SlurmError]:
    """Which error a Slurm message means. Permanent patterns win: they are more specific."""
    lowered = text.lower()
    if any(p in lowered for p in _PERMANENT_PATTERNS):
        return SlurmPermanentError
    if any(p in lowered for p in _TRANSIENT_PATTERNS):
        return SlurmTransientError
    return SlurmPermanentError


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # base state, lower case: idle, mixed, allocated, down, ...
    state_flags: tuple[str, ...] = ()  # upper case: DRAIN, REBOOT_REQUESTED, CLOUD, POWERED_DOWN...
    reason: str = ""
    partitions: tuple[str, ...] = ()
    slurmd_start_time: int = 0  # epoch seconds; a reboot (or slurmd restart) changes it

    @property
    def drained(self) -> bool:
        """Drain requested (DRAINING while jobs finish, DRAINED once empty)."""
        return "DRAIN" in self.state_flags

    @property
    def powered_down(self) -> bool:
        return "POWERED_DOWN" in self.state_flags

    @property
    def available(self) -> bool:
        """In service: up and schedulable, i.e. not drained, powered down, rebooting or silent
        (it may still be busy: ``allocated`` counts)."""
        blocked = {
            "DRAIN",
            "POWERED_DOWN",
            "POWERING_DOWN",
            "REBOOT_REQUESTED",
            "REBOOT_ISSUED",
            "NOT_RESPONDING",
            "MAINTENANCE",
            "FAIL",
        }
        return self.state in ("idle", "mixed", "allocated") and not blocked & set(self.state_flags)


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    job_state: str  # upper case: PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, ...
    nodes: str = ""  # hostlist expression as Slurm prints it, e.g. "n[1-2]"
    restart_cnt: int = 0
    requeue: bool = False
    state_reason: str = ""
    batch_host: str = ""
    partition: str = ""
    comment: str = ""
    work_dir: str = ""  # current_working_directory
    user: str = ""
    exit_code: int | None = None  # the wait status Slurm records (code << 8 | signal)
    command: str = ""

    @property
    def node_list(self) -> tuple[str, ...]:
        return expand_hostlist(self.nodes)

    @property
    def exit_status(self) -> int | None:
        """The exit as a shell reports it: the code, or 128 + the signal that ended it."""
        if self.exit_code is None:
            return None
        signal, code = self.exit_code & 0x7F, (self.exit_code >> 8) & 0xFF
        return 128 + signal if signal else code


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Expand ``n[1-3,5],c1`` to ``(n1, n2, n3, n5, c1)`` (one bracket group per name, as
    Slurm prints node lists); keeps zero padding such as ``gpu[01-02]``."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expr or ""):
        match = re.fullmatch(r"(?P<prefix>[^\[]*)\[(?P<ranges>[^\]]*)\](?P<suffix>.*)", part)
        if match is None:
            names.append(part)
            continue
        for chunk in match.group("ranges").split(","):
            lo, _, hi = chunk.partition("-")
            if not hi:
                names.append(f"{match['prefix']}{lo}{match['suffix']}")
                continue
            width = len(lo) if lo.startswith("0") else 0
            for number in range(int(lo), int(hi) + 1):
                names.append(f"{match['prefix']}{number:0{width}d}{match['suffix']}")
    return tuple(names)


# --------------------------------------------------------------------------- parsing


def _number(value: Any) -> int | None:
    """Slurm >= 23.02 wraps numbers as {"set": true, "number": N}; 22.05 gives plain ints."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _state(value: Any, flags: Any) -> tuple[str, tuple[str, ...]]:
    """22.05: state "idle" + state_flags [...]; >= 23.02: state ["IDLE", "DRAIN", ...]."""
    extra = tuple(str(f).upper() for f in flags) if isinstance(flags, list) else ()
    if isinstance(value, list):
        words = [str(v).upper() for v in value]
        base = words[0].lower() if words else "unknown"
        return base, (*words[1:], *extra)
    return str(value or "unknown").lower(), extra


def _check_json_errors(doc: Mapping[str, Any], argv: Sequence[str], raw: str) -> None:
    errors = doc.get("errors") or []
    if not errors:
        return
    texts = []
    for err in errors:
        if isinstance(err, Mapping):
            texts.append(
                " ".join(str(err.get(k, "")) for k in ("source", "description", "error") if err.get(k))
            )
        else:
            texts.append(str(err))
    message = f"{argv[0]} reported errors: {'; '.join(texts)}"
    # A read that comes back with errors almost always means slurmctld was not reachable, so
    # here the default is transient unless the text names a bad request.
    permanent = any(p in message.lower() for p in _PERMANENT_PATTERNS)
    cls = SlurmPermanentError if permanent else SlurmTransientError
    raise cls(message, argv=argv, returncode=0, output=raw[-2000:])


def parse_nodes(doc: Mapping[str, Any]) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` (v0.0.38: top-level "nodes") or ``scontrol show node --json``."""
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list):
        raise ValueError("no 'nodes' list in Slurm JSON")
    nodes = []
    for item in raw_nodes:
        if not isinstance(item, Mapping) or not item.get("name"):
            continue
        state, flags = _state(item.get("state"), item.get("state_flags"))
        partitions = item.get("partitions") or []
        nodes.append(
            SlurmNode(
                name=str(item["name"]),
                state=state,
                state_flags=flags,
                reason=str(item.get("reason") or ""),
                partitions=tuple(str(p) for p in partitions) if isinstance(partitions, list) else (),
                slurmd_start_time=_number(item.get("slurmd_start_time")) or 0,
            )
        )
    return nodes


def parse_jobs(doc: Mapping[str, Any]) -> list[SlurmJob]:
    raw_jobs = doc.get("jobs")
    if not isinstance(raw_jobs, list):
        raise ValueError("no 'jobs' list in Slurm JSON")
    jobs = []
    for item in raw_jobs:
        if not isinstance(item, Mapping):
            continue
        job_id = _number(item.get("job_id"))
        if job_id is None:
            continue
        state, _ = _state(item.get("job_state"), None)
        jobs.append(
            SlurmJob(
                job_id=job_id,
                name=str(item.get("name") or ""),
                job_state=state.upper(),
                nodes=str(item.get("nodes") or ""),
                restart_cnt=_number(item.get("restart_cnt")) or 0,
                requeue=bool(item.get("requeue", False)),
                state_reason=str(item.get("state_reason") or ""),
                batch_host=str(item.get("batch_host") or ""),
                partition=str(item.get("partition") or ""),
                comment=str(item.get("comment") or ""),
                work_dir=str(item.get("current_working_directory") or ""),
                user=str(item.get("user_name") or ""),
                exit_code=_number(item.get("exit_code")),
                command=str(item.get("command") or ""),
            )
        )
    return jobs


# --------------------------------------------------------------------------- client


class CommandOutput(Protocol):
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float, Mapping[str, str] | None], CommandOutput]
"""runner(argv, timeout_s, extra_env) -> output; may raise subprocess.TimeoutExpired/OSError."""


def subprocess_runner(slurm_conf: str | None = None) -> Runner:
    """The default runner: subprocess.run with a timeout; SLURM_CONF pinned if given."""

    def run(argv: Sequence[str], timeout_s: float, extra_env: Mapping[str, str] | None) -> CommandOutput:
        env = host_env(keep=("SLURM_CONF",))  # never the server's secrets: sbatch exports it
        if slurm_conf:
            env["SLURM_CONF"] = slurm_conf
        env.update(extra_env or {})
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    return run


class SlurmCli:
    """Typed Slurm commands. ``timeout_s`` bounds each command (client defaults retry for long)."""

    def __init__(
        self,
        runner: Runner | None = None,
        timeout_s: float = 30.0,
        *,
        slurm_conf: str | None = None,
    ) -> None:
        self._run = runner or subprocess_runner(slurm_conf)
        self.timeout_s = timeout_s

    # ------------------------------------------------------------------ reads

    def nodes(self) -> list[SlurmNode]:
        argv = ["sinfo", "--json"]
        try:
            return parse_nodes(self._json(argv))
        except ValueError as exc:
            raise SlurmPermanentError(f"unexpected sinfo JSON: {exc}", argv=argv) from exc

    def node(self, name: str) -> SlurmNode:
        for node in self.nodes():
            if node.name == name:
                return node
        raise SlurmPermanentError(f"Invalid node name specified: {name}", argv=["sinfo", "--json"])

    def jobs(self) -> list[SlurmJob]:
        argv = ["squeue", "--json"]
        try:
            return parse_jobs(self._json(argv))
        except ValueError as exc:
            raise SlurmPermanentError(f"unexpected squeue JSON: {exc}", argv=argv) from exc

    def job(self, job_id: int) -> SlurmJob:
        for job in self.jobs():
            if job.job_id == job_id:
                return job
        raise SlurmPermanentError(f"Invalid job id specified: {job_id}", argv=["squeue", "--json"])

    # ------------------------------------------------------------------ node actions

    def drain(self, node: str, reason: str) -> None:
        """Drain: running jobs keep running, nothing new is scheduled there."""
        self._check(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])

    def resume(self, node: str) -> None:
        """Undrain. Slurm answers 'Invalid node state specified' if the node is not drained."""
        self._check(["scontrol", "update", f"nodename={node}", "state=resume"])

    def reboot(self, node: str, reason: str, *, keep_drained: bool = False) -> None:
        """Reboot once idle (ASAP drains it meanwhile), then return it to service.
        ``keep_drained``: a plain reboot (no ASAP/nextstate) of a node the caller drained:
        it still waits for running jobs, and the node stays DRAINED afterwards (Slurm 22.05
        clears DRAIN after an ASAP or nextstate=resume reboot)."""
        if keep_drained:
            self._check(["scontrol", "reboot", f"reason={reason}", node])
        else:
            self._check(["scontrol", "reboot", "ASAP", "nextstate=resume", f"reason={reason}", node])

    def power_down(self, node: str) -> None:
        self._check(["scontrol", "update", f"nodename={node}", "state=power_down"])

    def power_up(self, node: str) -> None:
        self._check(["scontrol", "update", f"nodename={node}", "state=power_up"])

    def ensure_partition(self, name: str, nodes: str = "ALL") -> None:
        """Create (or update) a non-default partition over ``nodes`` (not persisted across a
        ``slurmctld -c`` start)."""
        try:
            self._check(["scontrol", "update", f"partitionname={name}", f"nodes={nodes}", "state=up"])
        except SlurmPermanentError as exc:
            if "invalid partition" not in str(exc).lower():
                raise
            self._check(["scontrol", "create", f"partitionname={name}", f"nodes={nodes}", "state=up",
                         "maxtime=infinite", "default=no"])

    # ------------------------------------------------------------------ job actions

    def requeue(self, job_id: int) -> None:
        self._check(["scontrol", "requeue", str(int(job_id))])

    def start_now(self, job_id: int) -> None:
        """Make a pending job eligible at once (a requeued job waits out a BeginTime delay)."""
        self._check(["scontrol", "update", f"jobid={int(job_id)}", "StartTime=now"])

    def signal_job(self, job_id: int, signal: str = "TERM", full: bool = False) -> None:
        """Send a signal to the job's steps; ``full`` also signals the batch shell itself."""
        argv = ["scancel", f"--signal={signal}"]
        if full:
            argv.append("--full")
        self._check([*argv, str(int(job_id))])

    def cancel(self, job_id: int) -> None:
        """Cancel the job outright (no requeue)."""
        self._check(["scancel", str(int(job_id))])

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
        """sbatch --parsable; returns the job id. ``env`` is added to the exported environment
        (through the process environment, so values may contain commas)."""
        if open_mode not in ("append", "truncate"):
            raise ValueError("open_mode must be 'append' or 'truncate'")
        argv = [
            "sbatch",
            "--parsable",
            f"--nodes={int(nodes)}",
            f"--job-name={job_name}",
            "--requeue" if requeue else "--no-requeue",
            f"--open-mode={open_mode}",
            "--export=ALL",
        ]
        if output:
            argv.append(f"--output={output}")
        if partition:
            argv.append(f"--partition={partition}")
        argv.extend(extra_args)
        argv.append(script_path)
        out = self._check(argv, env=env).strip()
        first = out.splitlines()[-1].split(";")[0].strip() if out else ""
        if not first.isdigit():
            raise SlurmPermanentError(
                f"sbatch printed no job id: {out[-200:]!r}", argv=argv, returncode=0, output=out
            )
        return int(first)

    # ------------------------------------------------------------------ plumbing

    def _invoke(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> CommandOutput:
        try:
            return self._run(argv, self.timeout_s, env)
        except subprocess.TimeoutExpired as exc:
            raise SlurmTransientError(f"{argv[0]} timed out after {self.timeout_s:g}s", argv=argv) from exc
        except FileNotFoundError as exc:
            raise SlurmPermanentError(
                f"{argv[0]} not found on PATH (is slurm-client installed?)", argv=argv
            ) from exc
        except OSError as exc:
            raise SlurmTransientError(f"{argv[0]} could not run: {exc}", argv=argv) from exc

    def _check(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        result = self._invoke(argv, env)
        if result.returncode != 0:
            text = " ".join(s for s in (result.stderr.strip(), result.stdout.strip()) if s)
            message = f"{' '.join(argv[:2])} failed ({result.returncode}): {text[-500:] or 'no output'}"
            raise classify(text)(message, argv=argv, returncode=result.returncode, output=text[-2000:])
        return result.stdout

    def _json(self, argv: Sequence[str]) -> Mapping[str, Any]:
        raw = self._check(argv)
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            # Truncated output is what a dying controller connection looks like: retry.
            raise SlurmTransientError(
                f"{argv[0]} printed invalid JSON: {exc}", argv=argv, output=raw[-2000:]
            ) from exc
        if not isinstance(doc, Mapping):
            raise SlurmTransientError(
                f"{argv[0]} printed JSON that is not an object", argv=argv, output=raw[-2000:]
            )
        _check_json_errors(doc, argv, raw)
        return doc
