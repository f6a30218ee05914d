"""`mtc bench recovery --target slurm`: the same trace, runner and score on a real Slurm cluster.

Each run starts a private Slurm cluster on this host (``scripts/slurm/cluster.sh``, as
``make demo-slurm`` does: four static nodes n1-n4 and two cloud nodes c1-c2, free ports, a
state directory of its own), wires the control plane to it (``embedded(state_dir,
compute="slurm", slurm_conf=...)``), plays the trace with :class:`bench_live.LiveRun` and
stops the cluster. Root only: the cluster's daemons (munged, slurmctld, slurmd) run as root
and ``cluster.sh`` installs Slurm with apt when it is missing.

How each fault is played on Slurm (:class:`SlurmFaults`, the seam the local compute fills
with :class:`bench_live.LocalFaults`):

- ``app_crash``: SIGKILL of the rank's program. Stand-in, said plainly: every Slurm node is
  a slurmd on this one host, so the program is found in ``/proc`` by its managed
  environment (``CLOUD_ML_JOB_ID``, ``MTC_NODE_ID``, ``MTC_JOB_ATTEMPT`` up to the current
  one), not on a machine of its own; its launcher records the exit and the adapter holds the
  other ranks (warm processes);
- ``xid_13`` / ``xid_79``: an XID line appended to the node's kernel log
  (``SlurmCompute.inject_xid``), which the node's agent reads, as the demo does;
- ``node_lost``: skipped, with the reason in the output (:data:`NODE_LOST_SKIPPED`);
- ``no_spare_elastic``: an operator drains every idle node (``scontrol`` drain), then XID 79.

The adapter runs with warm processes (``SlurmCompute(warm=True)``): an in-place or
scale-down attempt is a new step in the job's allocation and its held ranks go on in their
processes; a requeue, or a hot swap onto a node the allocation lacks, is a new batch job
(docs/recovery.md, "Warm processes on Slurm"). The warm standbys are the local compute's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtc_program import protocol
from services.cli.bench_live import LiveRun
from services.wiring.embedded import EmbeddedApp
from shared.adapters.compute.protocol import LAUNCHER
from shared.domain.errors import ValidationError
from shared.resilience.bench_config import bench_config
from shared.resilience.score import RunScore
from shared.resilience.trace import FaultKind, Trace

NAME = "slurm"
NODE_LOST_SKIPPED = (
    "the Slurm adapter has no way to make a node vanish here: every Slurm node is a slurmd "
    "on this host, a killed slurmd leaves its job steps running, and the repair it would "
    "get (scontrol reboot) is run by that slurmd, so it never completes")
WRAPPERS = frozenset({"bash", "sh", "srun", "slurmstepd", "sbatch"})  # not the program itself
# The node agents at the local bench's pace, with the probes this host can run: no GPU here
# (nvidia_smi, dcgm have nothing to read), and the speed probe's matmul on every node every
# tick would load the machine the benchmark measures. The faults need only the XID probe.
# Warm processes on: the job's allocation outlives its attempts, and held ranks go on in place.
COMPUTE_OPTIONS: dict[str, Any] = {"agent_interval_s": 0.5, "agent_probes": ("xid", "disk"),
                                   "warm": True}


def require_root() -> None:
    """Refuse, naming the option, unless root (the cluster's daemons run as root)."""
    if os.geteuid() != 0:
        raise ValidationError("--target", "slurm starts a private Slurm cluster on this host "
                              "(scripts/slurm/cluster.sh: munged, slurmctld and slurmd run as "
                              "root): run it as root, or use --target embedded")


def rank_pids(job_id: str, attempt: int, node_id: str, proc: Path = Path("/proc")) -> list[int]:
    """The pids of the programs (not their launchers or shells) of the job's ``attempt`` on
    mtc node ``node_id``, by their managed environment in ``/proc``. A process that went on
    in place shows the environment it started with (``/proc/<pid>/environ`` is not what
    ``os.environ`` became), so a program of an earlier attempt counts: it is the rank's."""
    want = {protocol.JOB_ID.encode(): job_id.encode(), protocol.NODE_ID.encode(): node_id.encode()}
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        env = dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)
        if any(env.get(k) != v for k, v in want.items()):
            continue
        started = env.get(protocol.JOB_ATTEMPT.encode(), b"")
        if not started.isdigit() or int(started) > attempt:
            continue
        if _wrapper(argv):
            continue
        out.append(int(entry.name))
    return sorted(out)


def _wrapper(argv: list[bytes]) -> bool:
    """A shell, srun or the worker launcher: they carry the rank's environment too."""
    if not argv or not argv[0]:
        return True
    if os.path.basename(argv[0].decode(errors="replace")) in WRAPPERS:
        return True
    return any(arg.decode(errors="replace").endswith(LAUNCHER.name) for arg in argv)


class SlurmFaults:
    """Faults on the Slurm adapter's nodes (see the module docstring)."""

    name = NAME

    def __init__(self, app: EmbeddedApp) -> None:
        self.compute = app.compute
        self.killed: list[int] = []

    def cannot(self, kind: FaultKind) -> str | None:
        return NODE_LOST_SKIPPED if kind is FaultKind.NODE_LOST else None

    def kill_ranks(self, job_id: str, attempt: int, node_id: str) -> None:
        for pid in rank_pids(job_id, attempt, node_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)

    def xid(self, node_id: str, code: int, now: float) -> None:
        self.compute.inject_xid(node_id, code)

    def lose_node(self, job_id: str, attempt: int, node_id: str, now: float) -> None:
        raise NotImplementedError(NODE_LOST_SKIPPED)  # cannot() says so first

    def attempt_whole(self, job_id: str, attempt: int) -> bool:
        return False  # every recovery on Slurm is a new attempt (a new batch job)


@contextlib.contextmanager
def slurm_cluster(say: Any) -> Iterator[str]:
    """A private cluster for one run (its slurm.conf), stopped and removed afterwards."""
    from services.cli.demo_slurm import SlurmCluster, start_cluster

    slurm_dir = Path(tempfile.mkdtemp(prefix="mtc-bench-slurm-"))
    say(f"starting a Slurm cluster in {slurm_dir} (scripts/slurm/cluster.sh)")
    cluster = None
    try:
        cluster = start_cluster(slurm_dir)
        yield cluster.slurm_conf
    finally:  # a start that failed half way stops what it started (its pids in the dir)
        (cluster or SlurmCluster(slurm_dir, {**os.environ, "MTC_SLURM_DIR": str(slurm_dir)})
         ).stop()
        shutil.rmtree(slurm_dir, ignore_errors=True)


def run_slurm(trace: Trace, state_dir: Path, *, pin: str | None, timeout_s: float = 120.0,
              say: Any = None, program: str = "train") -> RunScore:
    """Play ``trace`` on a fresh Slurm cluster with the control plane over ``state_dir``."""
    from services.wiring.embedded import embedded

    say = say or (lambda _msg: None)
    require_root()
    with slurm_cluster(say) as slurm_conf:
        app = embedded(state_dir, compute="slurm", slurm_conf=slurm_conf, config=bench_config(),
                       compute_options=dict(COMPUTE_OPTIONS))
        try:
            return LiveRun(app, trace, pin=pin, timeout_s=timeout_s, say=say,
                           faults=SlurmFaults(app), program=program).run()
        finally:
            app.compute.kill_all()
            app.compute.close()
            app.close()
