"""A real Slurm cluster (scripts/slurm/cluster.sh) for the whole test session.

Each session runs its own cluster in a fresh state dir on free ports (not the developer's
/tmp/mtc-slurm): several sessions on one machine may run these tests at once, and
``cluster.sh stop`` only kills the PIDs recorded in its own state dir. The dir is removed at
the end (keep it with MTC_SLURM_TEST_KEEP=1; pin it with MTC_SLURM_TEST_DIR and
MTC_SLURM_TEST_PORT_BASE).

Each node's slurmd runs the node agent as HealthCheckProgram against a per-node fault log,
so a test can inject an XID by appending a line and watch the node drain itself (the
"plain drain" baseline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.cli.demo_slurm import free_port_base
from shared.adapters.compute.slurm.cli import SlurmCli

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "slurm" / "cluster.sh"
STATIC_NODES = ("n1", "n2", "n3", "n4")


@dataclass(frozen=True)
class Cluster:
    state_dir: Path
    slurm_conf: str
    jobs_dir: Path
    faults_dir: Path
    slurm: SlurmCli
    env: dict[str, str] = field(repr=False)

    def slurmd_pid(self, node: str) -> int | None:
        path = self.state_dir / "pids" / f"slurmd-{node}.pid"
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    def script(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT), command], env=self.env, capture_output=True, text=True, timeout=120
        )


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25) -> float:
    """Poll until ``predicate`` holds; return the seconds it took, fail the test on timeout."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def timing(name: str, seconds: float) -> None:
    print(f"\n[timing] {name}: {seconds:.1f}s", file=sys.stderr)


def _write_healthcheck(state_dir: Path, faults: Path) -> Path:
    """slurmd runs this with an almost empty environment (no SLURM_CONF either): absolute
    paths only, and the agent is told where slurm.conf is for its scontrol drain. The agent
    runs when its node's fault log has changed since its last run (and on the first): every
    5 s on every node for the whole session it took a third of a core, and with the other
    checks skipped a run over an unchanged log finds nothing."""
    script = state_dir / "healthcheck.sh"
    log, seen = f'{faults}/"$SLURMD_NODENAME".log', f'{faults}/"$SLURMD_NODENAME".seen'
    script.write_text(
        "#!/bin/bash\n"
        f"cd {REPO} || exit 0\n"
        f'now=$(stat -c %s:%Y {log} 2>/dev/null)\n'
        f'[ -n "$now" ] && [ "$now" = "$(cat {seen} 2>/dev/null)" ] && exit 0\n'
        f'echo "$now" > {seen}\n'
        f"exec {sys.executable} -m services.node_agent --slurm-healthcheck --drain-on-fault \\\n"
        f"  --skip nvidia_smi,dcgm,speed,disk --slurm-conf {state_dir}/etc/slurm.conf \\\n"
        f'  --xid-source {faults}/"$SLURMD_NODENAME".log \\\n'
        f'  --xid-cursor {faults}/"$SLURMD_NODENAME".cursor >/dev/null 2>>{faults}/healthcheck.err\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if sys.platform != "linux":
        pytest.skip("the Slurm test cluster needs Linux")
    pinned = os.environ.get("MTC_SLURM_TEST_DIR")
    state_dir = Path(pinned or tempfile.mkdtemp(prefix="mtc-slurm-it-"))
    faults = state_dir / "faults"
    faults.mkdir(parents=True, exist_ok=True)
    for node in STATIC_NODES:
        (faults / f"{node}.log").write_text("")
        (faults / f"{node}.cursor").unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        MTC_SLURM_DIR=str(state_dir),
        MTC_SLURM_PORT_BASE=os.environ.get("MTC_SLURM_TEST_PORT_BASE") or str(free_port_base()),
        MTC_SLURM_HEALTHCHECK_PROGRAM=str(_write_healthcheck(state_dir, faults)),
        MTC_SLURM_HEALTHCHECK_INTERVAL="5",
    )
    conf = str(state_dir / "etc" / "slurm.conf")
    jobs = state_dir / "jobs"
    jobs.mkdir(exist_ok=True)
    handle = Cluster(state_dir, conf, jobs, faults, SlurmCli(timeout_s=30.0, slurm_conf=conf), env)
    handle.script("stop")  # a pinned dir may hold a cluster from an interrupted session
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=900
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        _cleanup(handle, pinned)
        pytest.skip(f"could not run scripts/slurm/cluster.sh start: {exc}")
    if proc.returncode != 0:
        _cleanup(handle, pinned)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        pytest.skip(f"slurmctld could not be installed or started (cluster.sh start): {tail}")
    timing("cluster.sh start (incl. any install)", time.monotonic() - started)
    try:
        yield handle
    finally:
        _cleanup(handle, pinned)


def _cleanup(handle: Cluster, pinned: str | None) -> None:
    handle.script("stop")
    if not pinned and not os.environ.get("MTC_SLURM_TEST_KEEP"):
        shutil.rmtree(handle.state_dir, ignore_errors=True)


@pytest.fixture
def slurm(cluster: Cluster) -> SlurmCli:
    return cluster.slurm
