"""`make demo-slurm`: the self-healing story on a real Slurm cluster, with `sinfo` at each step.

    python -m services.cli.demo_slurm [--steps N] [--keep-cluster] [--state-dir DIR]

It starts a private Slurm 22.05 cluster on this host (scripts/slurm/cluster.sh: four static
nodes n1-n4, two power-saving cloud nodes c1-c2, free ports, its own state dir), wires the
control plane to it (``services.wiring.embedded(..., compute="slurm")``) and runs the story:

1. an mtc cluster of four worker nodes (one hot spare) is provisioned onto n1-n4: each is
   drained in Slurm until its node agent's first checks pass, then resumed;
2. examples/train.py runs as a 2-node ``sbatch`` job (one ``srun`` task per node);
3. an XID 79 line is appended to the kernel log of one of its nodes; that node's agent
   reports it, triage says "GPU fell off the bus -> reboot", the node is drained in Slurm,
   the job is told to checkpoint (``scancel --signal=TERM``), exits 75, is submitted again on
   healthy nodes and resumes from its checkpoint;
4. the faulty node is rebooted (``scontrol reboot``), passes its checks and is resumed;
5. the job finishes; the summary shows restarts, the resume step and goodput.

The cluster is stopped at the end (``--keep-cluster`` leaves it running).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from services.cli.demo import fresh_state
from services.job_submission import commands as job_commands
from services.presentation.timeline import describe
from services.presentation.timeline import style as timeline_style
from services.wiring.embedded import EmbeddedApp, embedded
from shared.config import ControlPlaneConfig
from shared.domain.errors import ValidationError
from shared.domain.events import Envelope
from shared.domain.model import Job, JobState, NodeState
from shared.goodput import job_accounting
from shared.handling import Outcome

console = Console(highlight=False)
ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = ROOT / "scripts" / "slurm" / "cluster.sh"
PORT_OFFSETS = (0, 1, 2, 3, 4, 11, 12, 20)  # slurmctld, n1-n4, c1-c2, slurmrestd (cluster.sh)
CLUSTER_ID = "slurm-demo"
STEP_TIME_S = 0.05
CHECKPOINT_EVERY_STEPS = 20
GRACE_PERIOD_S = 15.0
TIMEOUT_S = 120.0
# event types after which the demo prints sinfo (the handlers have acted by then)
SINFO_AFTER = frozenset(
    {
        "mtc.node.diagnosed.v1",
        "mtc.job.signalled.v1",
        "mtc.job.workers_exited.v1",
        "mtc.job.started.v1",
        "mtc.node.repair_started.v1",
        "mtc.node.repair_completed.v1",
        "mtc.node.returned_to_service.v1",
        "mtc.node.repair_held.v1",
        "mtc.job.finished.v1",
    }
)


def cluster_spec(cluster_id: str = CLUSTER_ID, nodes: int = 4, spares: int = 1) -> dict[str, Any]:
    return {
        "clusterId": cluster_id,
        "displayName": "self-healing on Slurm",
        "loginNode": {"machineType": "n2-standard-8"},
        "nodePools": [
            {
                "id": "h100",
                "nodeCount": nodes,
                "spareCount": spares,
                "machineSpec": {
                    "machineType": "a3-highgpu-8g",
                    "acceleratorType": "NVIDIA_H100_80GB",
                    "acceleratorCount": 8,
                },
            }
        ],
        "partitions": [{"name": "train", "nodePoolIds": ["h100"]}],
    }


def job_spec(steps: int, *, replicas: int = 2, step_time_s: float = STEP_TIME_S) -> dict[str, Any]:
    return {
        "displayName": "numpy-regression-on-slurm",
        "jobSpec": {
            "workerPoolSpecs": [
                {
                    "machineSpec": {
                        "machineType": "a3-highgpu-8g",
                        "acceleratorType": "NVIDIA_H100_80GB",
                        "acceleratorCount": 8,
                    },
                    "replicaCount": replicas,
                    "containerSpec": {
                        "imageUri": "local/examples:latest",
                        "command": [sys.executable, str(ROOT / "examples" / "train.py")],
                        "args": [
                            "--steps",
                            str(steps),
                            "--checkpoint-every",
                            str(CHECKPOINT_EVERY_STEPS),
                            "--step-time",
                            str(step_time_s),
                        ],
                    },
                }
            ],
            "scheduling": {"partition": "train", "restartJobOnWorkerRestart": False},
        },
    }


def demo_config() -> ControlPlaneConfig:
    return replace(ControlPlaneConfig(), grace_period_s=GRACE_PERIOD_S, heartbeat_timeout_s=30.0)


# ---------------------------------------------------------------- a private Slurm cluster


def free_port_base() -> int:
    """A port base whose cluster ports (see cluster.sh) are all free on this host."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000, 100)
        try:
            for offset in PORT_OFFSETS:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                    probe.bind(("0.0.0.0", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range for a Slurm cluster")


@dataclass
class SlurmCluster:
    """scripts/slurm/cluster.sh in its own state dir: started here, stopped by ``stop()``."""

    state_dir: Path
    env: dict[str, str]

    @property
    def slurm_conf(self) -> str:
        return str(self.state_dir / "etc" / "slurm.conf")

    def script(self, command: str, timeout_s: float = 900.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def stop(self) -> None:
        self.script("stop", timeout_s=120.0)


def start_cluster(
    state_dir: Path, *, healthcheck_program: str | None = None, healthcheck_interval_s: int = 5
) -> SlurmCluster:
    """Start (or find running) a cluster in ``state_dir`` on free ports."""
    env = dict(os.environ)
    env["MTC_SLURM_DIR"] = str(state_dir)
    env.setdefault("MTC_SLURM_PORT_BASE", str(free_port_base()))
    if healthcheck_program:
        env["MTC_SLURM_HEALTHCHECK_PROGRAM"] = healthcheck_program
        env["MTC_SLURM_HEALTHCHECK_INTERVAL"] = str(healthcheck_interval_s)
    cluster = SlurmCluster(state_dir, env)
    proc = cluster.script("start")
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise SystemExit(f"scripts/slurm/cluster.sh start failed:\n{tail}")
    return cluster


def sinfo_text(slurm_conf: str, partition: str = "mtc") -> str:
    """What a Slurm user would type: ``sinfo -N`` (node, state, reason) and ``squeue``."""
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    out = []
    for argv in (
        ["sinfo", "-N", "-p", partition, "-o", "%.5N %.10T  %E"],
        ["squeue", "-p", partition, "-o", "%.6i %.22j %.9T %.3D %R"],
    ):
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=10, check=False)
            out.append((proc.stdout or proc.stderr).rstrip())
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.append(f"{argv[0]}: {exc}")
    return "\n".join(out)


# ---------------------------------------------------------------- the story


def _printer(
    app: EmbeddedApp, t0: float, partition: str, sinfo_on: dict[str, bool]
) -> Callable[[Envelope, dict[str, Outcome]], None]:
    from services.presentation.timeline import is_routine
    from shared.adapters.outbox import envelope_to_doc

    def show(env: Envelope, outcomes: dict[str, Outcome]) -> None:
        doc = envelope_to_doc(env)
        if is_routine(doc) or doc["type"] == "mtc.node.provisioned.v1":
            return
        style = timeline_style(env.type)
        line = escape(describe(doc))
        console.print(f"[dim]{env.time - t0:7.2f}s[/dim]  [{style}]{line}[/{style}]")
        if env.type in SINFO_AFTER and sinfo_on["on"]:
            slurm = app.compute.slurm_conf
            console.print(f"[dim]{escape(_indent(sinfo_text(slurm, partition)))}[/dim]")

    return show


def _indent(text: str) -> str:
    return "\n".join(f"           {line}" for line in text.splitlines())


def wait(app: EmbeddedApp, what: str, until: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    if not app.run(until, timeout_s=timeout_s, poll_s=0.05, tick_s=2.0):
        raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")


def job(app: EmbeddedApp, job_id: str) -> Job:
    with app.transaction() as uow:
        found = uow.jobs.get(job_id)
    if found is None:
        raise LookupError(job_id)
    return found


def node_state(app: EmbeddedApp, node_id: str) -> NodeState | None:
    with app.transaction() as uow:
        node = uow.nodes.get(node_id)
        return node.state if node else None


def cluster_ready(app: EmbeddedApp, cluster_id: str = CLUSTER_ID) -> bool:
    with app.transaction() as uow:
        cluster = uow.clusters.get(cluster_id)
        return cluster is not None and cluster.state.value == "READY"


def create_cluster(app: EmbeddedApp, spec: dict[str, Any]) -> None:
    with app.transaction() as uow:
        job_commands.create_cluster(spec, uow, app.deps)
    wait(app, f"cluster {spec['clusterId']} READY", lambda: cluster_ready(app, spec["clusterId"]))


def run_story(app: EmbeddedApp, *, steps: int = 300) -> Job:
    t0 = app.deps.clock.now()
    partition = app.compute.partition or "main"
    console.rule("[bold]mtc self-healing on a real Slurm cluster (sbatch, scontrol, sinfo)")
    sinfo_on = {"on": False}  # not while the four nodes come up: once, after
    app.bus.listeners.append(_printer(app, t0, partition, sinfo_on))
    create_cluster(app, cluster_spec())
    sinfo_on["on"] = True
    console.print(
        "[bold]cluster READY; mtc node -> Slurm node:[/bold] "
        + ", ".join(f"{k} -> {v}" for k, v in app.compute.mapping().items())
    )
    console.print(f"[dim]{escape(_indent(sinfo_text(app.compute.slurm_conf, partition)))}[/dim]")
    with app.transaction() as uow:
        submitted = job_commands.submit_job(CLUSTER_ID, job_spec(steps), uow, app.deps, "train-1")
    job_id = submitted.job_id
    wait(app, "a first checkpoint", lambda: job(app, job_id).latest_checkpoint is not None)
    app.run(lambda: False, timeout_s=CHECKPOINT_EVERY_STEPS * STEP_TIME_S / 2, poll_s=0.05)
    victim = job(app, job_id).node_ids[0]  # mid-interval: the SIGTERM checkpoint matters
    slurm_node = app.compute.slurm_node_of(victim)
    path = app.compute.inject_xid(victim, 79)
    console.print(
        f"[bold magenta]>>> XID 79 (GPU fell off the bus) appended to {slurm_node}'s kernel log ({path})"
    )
    wait(
        app,
        "the job to finish and the node to return",
        lambda: job(app, job_id).terminal and node_state(app, victim) is NodeState.IDLE,
    )
    return job(app, job_id)


def summary(app: EmbeddedApp, final: Job, t0: float) -> None:
    docs = list(app.deps.event_log.read()) if app.deps.event_log else []
    acct = job_accounting(docs, final.job_id)
    console.rule("[bold]result")
    colour = "green" if final.state is JobState.SUCCEEDED else "red"
    console.print(
        f"job {final.job_id}: [bold {colour}]{final.state.value}[/]  restarts: "
        f"{final.restart_count}  attempts: {final.attempt}"
    )
    log_text = app.compute.job_log(final.job_id).read_text(errors="replace")
    resumed = re.findall(r"resumed from step (\d+)", log_text)
    console.print(f"resumed from step(s): {', '.join(resumed) or 'none'} (from the Slurm job output)")
    console.print(
        f"lost work: {acct.lost_steps} step(s) recomputed; goodput: runtime "
        f"{acct.runtime_goodput:.1%} (productive {acct.productive_s:.1f} s of {acct.wall_s:.1f} s)"
    )
    alerts = app.compute.alerts()
    console.print(f"alerts: {len(alerts)}" + "".join(f"\n  {a.kind} {a.subject}: {a.detail}" for a in alerts))
    console.print(f"demo wall time: {time.time() - t0:.1f} s")
    console.print(f"Slurm job output: {app.compute.job_log(final.job_id)}")
    console.print(escape(sinfo_text(app.compute.slurm_conf, app.compute.partition or "main")))


@contextlib.contextmanager
def demo_cluster(slurm_dir: Path, keep: bool) -> Iterator[SlurmCluster]:
    cluster = start_cluster(slurm_dir)
    try:
        yield cluster
    finally:
        if not keep:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="demo_slurm", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps (0.05 s each)")
    parser.add_argument("--state-dir", default="var/demo-slurm",
                        help="control-plane state (a directory the demo makes; wiped next run)")
    parser.add_argument("--slurm-dir", default="/tmp/mtc-slurm-demo", help="the Slurm cluster's state dir")
    parser.add_argument("--keep-cluster", action="store_true", help="leave the Slurm cluster running")
    args = parser.parse_args(argv)
    try:  # a directory of the demo's own: only one bearing its sentinel is ever deleted
        state_dir = fresh_state(Path(args.state_dir))
    except ValidationError as exc:
        console.print(f"[bold red]demo: {escape(str(exc))}")
        return 2
    t0 = time.time()
    console.print(f"starting a Slurm cluster in {args.slurm_dir} (scripts/slurm/cluster.sh) ...")
    with demo_cluster(Path(args.slurm_dir), args.keep_cluster) as cluster:
        app = embedded(state_dir, compute="slurm", slurm_conf=cluster.slurm_conf,
                       config=demo_config())
        try:
            final = run_story(app, steps=args.steps)
            summary(app, final, t0)
        except TimeoutError as exc:
            console.print(f"[bold red]demo failed: {exc}")
            console.print(escape(sinfo_text(cluster.slurm_conf)))
            return 1
        finally:
            app.compute.kill_all()
            app.compute.close()
            app.close()
    return 0 if final.state is JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
