"""`make demo`: the whole self-healing story on the embedded default, in one run.

A cluster of three worker nodes and one hot spare comes up; the example training program
runs on two of them; an XID 79 (GPU fallen off the bus) hits one; the node is diagnosed and
drained, the job checkpoints on SIGTERM and is requeued onto the spare, resumes from its
checkpoint, the faulty node is rebooted, passes its checks and returns to service, and the
job succeeds. Then: restarts, lost work and goodput, from the event log. Then a second job,
with checkpoint tiers, tells the in-place and hot-swap stories (``demo_tiers``).
`mtc demo --torch` (`make demo-torch`) tells the story with a PyTorch job (``demo_torch``).
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from services.cli.demo_wait import wait
from services.job_submission import commands as job_commands
from services.presentation.timeline import describe
from services.presentation.timeline import style as timeline_style
from services.wiring.embedded import EmbeddedApp
from shared.config import ControlPlaneConfig
from shared.domain.errors import ValidationError
from shared.domain.events import Envelope
from shared.domain.health import Condition, ConditionStatus, ConditionType, RepairAction
from shared.domain.model import JobState, NodeState
from shared.goodput import job_accounting
from shared.handling import Outcome
from shared.policies.restarts import RestartConfig

console = Console(highlight=False)
ROOT = Path(__file__).resolve().parents[2]
# -- demo constants (seconds unless named otherwise)
STEP_TIME_S = 0.05
CHECKPOINT_EVERY_STEPS = 20
GRACE_PERIOD_S = 10.0
TORCH_GRACE_PERIOD_S = 30.0
REPAIR_DURATIONS_S = {RepairAction.RESET_GPU: 0.5, RepairAction.REBOOT: 1.0,
                      RepairAction.REIMAGE: 2.0, RepairAction.REPLACE: 2.0}
TIMEOUT_S = 50.0

CLUSTER_SPEC: dict[str, Any] = {
    "clusterId": "demo",
    "displayName": "self-healing demo",
    "loginNode": {"machineType": "n2-standard-8"},
    "nodePools": [{"id": "h100", "nodeCount": 4, "spareCount": 1,
                   "machineSpec": {"machineType": "a3-highgpu-8g",
                                   "acceleratorType": "NVIDIA_H100_80GB",
                                   "acceleratorCount": 8}}],
    "partitions": [{"name": "train", "nodePoolIds": ["h100"]}],
}


def job_spec(steps: int) -> dict[str, Any]:
    return {
        "displayName": "numpy-regression",
        "jobSpec": {
            "workerPoolSpecs": [{
                "machineSpec": {"machineType": "a3-highgpu-8g",
                                "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
                "replicaCount": 2,
                "containerSpec": {
                    "imageUri": "local/examples:latest",
                    "command": [sys.executable, str(ROOT / "examples" / "train.py")],
                    "args": ["--steps", str(steps), "--checkpoint-every",
                             str(CHECKPOINT_EVERY_STEPS), "--step-time", str(STEP_TIME_S)],
                },
            }],
            "scheduling": {"partition": "train", "restartJobOnWorkerRestart": False},
        },
    }


def demo_config(*, torch: bool = False) -> ControlPlaneConfig:
    """The demo's control plane. The PyTorch story restarts twice, so its backoff is short
    (the restart policy is today's, only faster), and its ranks (torch, under torchrun, on a
    loaded machine) get more than 10 s to save and exit on SIGTERM."""
    config = replace(ControlPlaneConfig(), grace_period_s=GRACE_PERIOD_S, heartbeat_timeout_s=30)
    if torch:
        config = replace(config, restart=RestartConfig(backoff_base_s=1.0),
                         grace_period_s=TORCH_GRACE_PERIOD_S)
    return config


def demo_compute_options() -> dict[str, Any]:
    return {"repair_durations_s": REPAIR_DURATIONS_S, "provision_duration_s": 0.2,
            "agent_interval_s": 0.5}


DEFAULT_STATE_DIR = Path("var/demo")
STATE_SUBDIR = "mtc-demo"  # the demo's own directory inside one the user names
SENTINEL = ".mtc-demo"  # written into every directory the demo made; nothing else is removed


def demo_state_dir(named: str | Path | None) -> Path:
    """Where the demo keeps its state: ``var/demo``, or a subdirectory of its own inside the
    directory the user named (``--state-dir``, ``MTC_STATE_DIR``), never that directory
    itself: whatever else is in it is the user's."""
    return Path(named) / STATE_SUBDIR if named else DEFAULT_STATE_DIR


def fresh_state(state_dir: Path) -> Path:
    """Make ``state_dir`` an empty directory of the demo's own, marked with SENTINEL.

    Only a directory bearing the sentinel (one an earlier demo made) is deleted; an empty
    one is taken; a non-empty one without it, a file or a symlink is refused
    (ValidationError naming ``--state-dir``) and left as it was."""
    if state_dir.is_symlink() or (state_dir.exists() and not state_dir.is_dir()):
        raise ValidationError("--state-dir", f"{state_dir} is not a directory the demo made; "
                              "name another")
    if state_dir.is_dir():
        if (state_dir / SENTINEL).is_file():
            shutil.rmtree(state_dir)
        elif any(state_dir.iterdir()):
            raise ValidationError(
                "--state-dir", f"{state_dir} is not empty and the demo did not make it (no "
                f"{SENTINEL} in it); the demo only deletes directories it made: name another "
                "directory, or empty this one yourself")
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / SENTINEL).write_text("made by `mtc demo`: the next demo run deletes this "
                                      "directory and everything in it\n")
    return state_dir


def _printer(t0: float) -> Any:
    from services.presentation.timeline import is_routine
    from shared.adapters.outbox import envelope_to_doc

    def show(env: Envelope, outcomes: dict[str, Outcome]) -> None:
        doc = envelope_to_doc(env)
        if is_routine(doc) or doc["data"].get("tier", "durable") != "durable":
            return  # (the memory and peer tiers' saves, every few steps, are routine too)
        style = timeline_style(env.type)
        console.print(f"[dim]{env.time - t0:7.2f}s[/dim]  [{style}]{escape(describe(doc))}[/{style}]")

    return show


def run_demo(app: EmbeddedApp, *, steps: int = 120) -> None:
    t0 = app.deps.clock.now()
    console.rule("[bold]mtc self-healing demo (embedded: sqlite, in-process bus, "
                 "subprocess workers)")
    app.bus.listeners.append(_printer(t0))
    try:
        _story(app, steps, t0)
    finally:
        app.compute.kill_all()


def _story(app: EmbeddedApp, steps: int, t0: float) -> None:
    with app.transaction() as uow:
        job_commands.create_cluster(CLUSTER_SPEC, uow, app.deps)
    _wait(app, "cluster READY", lambda: _cluster_ready(app))
    with app.transaction() as uow:
        job = job_commands.submit_job("demo", job_spec(steps), uow, app.deps, "train-1")
    job_id = job.job_id
    _wait(app, "a first checkpoint", lambda: _job(app, job_id).latest_checkpoint is not None,
          job_id)
    app.run(lambda: False, timeout_s=CHECKPOINT_EVERY_STEPS * STEP_TIME_S / 2, poll_s=0.05)
    victim = _job(app, job_id).node_ids[0]  # mid-interval: the SIGTERM checkpoint matters
    console.print(f"[bold magenta]>>> injecting XID 79 (GPU fell off the bus) on {victim}")
    now = app.deps.clock.now()
    app.compute.inject_fault(victim, [Condition(ConditionType.XID_ERROR.value,
                                                ConditionStatus.TRUE, "NVRM: Xid 79", now,
                                                {"xids": [79]})])
    _wait(app, "the job to succeed and the node to return",
          lambda: _job(app, job_id).terminal and _node_state(app, victim) is NodeState.IDLE)
    _summary(app, job_id, t0)
    from services.cli.demo_tiers import tiers_story

    console.rule("[bold]recovery from the checkpoint tiers: in place, hot swap")
    tiers_story(app, "demo", console.print)
    console.print(f"demo wall time: {time.time() - t0:.1f} s")


def _summary(app: EmbeddedApp, job_id: str, t0: float) -> None:
    job = _job(app, job_id)
    docs = list(app.deps.event_log.read()) if app.deps.event_log else []
    acct = job_accounting(docs, job_id)
    console.rule("[bold]result")
    colour = "green" if job.state is JobState.SUCCEEDED else "red"
    console.print(f"job {job_id}: [bold {colour}]{job.state.value}[/]  restarts: "
                  f"{job.restart_count}  attempts: {job.attempt}")
    console.print(f"lost work: {acct.lost_steps} step(s) recomputed "
                  f"({acct.lost_steps * STEP_TIME_S:.2f} s of training)")
    console.print(f"goodput: runtime {acct.runtime_goodput:.1%} "
                  f"(productive {acct.productive_s:.1f} s of {acct.wall_s:.1f} s wall; "
                  f"recovery {acct.recovery_s:.1f} s)")
    console.print(f"demo wall time: {time.time() - t0:.1f} s")
    console.print(_node_table(app))


def _node_table(app: EmbeddedApp) -> Any:
    from rich.table import Table

    from services.presentation.views import node_view

    with app.transaction() as uow:
        nodes = sorted(uow.nodes.list("demo"), key=lambda n: n.node_id)
    table = Table("PARTITION", "NODE", "STATE", "SPARE", "FAILURES", "REASON",
                  title="mtc node list")
    for v in map(node_view, nodes):
        table.add_row(v["partition"], v["nodeId"], v["state"], "yes" if v["spare"] else "",
                      str(v["failures"]), v["reason"])
    return table


def _wait(app: EmbeddedApp, what: str, until: Any, *job_ids: str) -> None:
    """Until ``until()``; not past the end of the jobs ``job_ids`` (``demo_wait``)."""
    wait(app, "demo", what, until, jobs=job_ids, timeout_s=TIMEOUT_S, tick_s=2.0)


def _job(app: EmbeddedApp, job_id: str) -> Any:
    with app.transaction() as uow:
        return uow.jobs.get(job_id)


def _node_state(app: EmbeddedApp, node_id: str) -> NodeState | None:
    with app.transaction() as uow:
        node = uow.nodes.get(node_id)
        return node.state if node else None


def _cluster_ready(app: EmbeddedApp) -> bool:
    with app.transaction() as uow:
        cluster = uow.clusters.get("demo")
        return cluster is not None and cluster.state.value == "READY"
