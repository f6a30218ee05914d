"""`make demo-torch`: the self-healing story with a real PyTorch job.

The tiny **pretrain recipe** (a Llama-shaped causal LM, ``services.recipes.programs.lm``) runs as an
ordinary CustomJob on the embedded default on 2 nodes x 2 ranks: pool 0 one replica, pool 1
one replica, ``MTC_PROCESSES_PER_NODE=2`` (``torch.distributed.run`` per node, gloo on CPU).
Beside it, on the same cluster, the same recipe and seed runs uninterrupted: the reference.

1. an XID 79 on one of the job's nodes: diagnosed, drained, SIGTERM; the ranks agree on a
   step and save a ``torch.distributed.checkpoint`` (exit 75); the job is requeued onto the
   spare and resumes from that checkpoint; the node is rebooted and returns;
2. a SIGKILL of one rank (its process, not its node's launcher): torchrun ends the node's
   other rank, the gang ends, the job restarts (``restartJobOnWorkerRestart``) and resumes
   from its newest complete checkpoint (the steps since are recomputed).

At the end it checks that the TensorBoard loss curve holds every step exactly once across
the attempts and that the final weights equal the reference run's (``torch.equal`` on
every tensor of the saved ``model.safetensors``), and prints where the logs are.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtc_program import protocol
from services.cli.demo import CLUSTER_SPEC as NUMPY_CLUSTER_SPEC
from services.cli.demo import _cluster_ready, _job, _node_state, _printer, console
from services.cli.demo_wait import wait
from services.job_submission import commands as job_commands
from services.recipes.catalog import PROGRAM, custom_job, program_pythonpath, resolve
from services.wiring.embedded import EmbeddedApp
from shared.domain.events import Envelope, NodeHealthReported
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.domain.model import JobState, NodeState
from shared.service_layer.gangs import output_dirs

JOB_ID, REFERENCE_ID = "pretrain-1", "pretrain-ref"
PROCESSES_PER_NODE = 2
TIMEOUT_S = 300.0  # torch and transformers start slowly on a loaded machine
# 2 nodes for the job, 2 for the reference, 1 hot spare
CLUSTER_SPEC: dict[str, Any] = {
    **NUMPY_CLUSTER_SPEC, "displayName": "self-healing demo (PyTorch)",
    "nodePools": [{**NUMPY_CLUSTER_SPEC["nodePools"][0], "nodeCount": 5, "spareCount": 1}]}


@dataclass(frozen=True)
class TorchStory:
    """The job's size: ``steps``, a durable checkpoint every ``every`` steps, and
    ``sleep_s`` per step (time to inject a fault between checkpoints; no effect on the math)."""

    steps: int = 40
    every: int = 10
    sleep_s: float = 0.25


@dataclass
class Outcome:
    state: JobState
    restarts: int
    steps_logged: list[int]
    equal: bool
    unequal: list[str] = field(default_factory=list)
    tensorboard_dir: str = ""
    model_dir: str = ""

    @property
    def continuous(self) -> bool:
        return bool(self.steps_logged) and self.steps_logged == list(
            range(1, len(self.steps_logged) + 1))


def recipe_job(story: TorchStory, *, reference: bool) -> dict[str, Any]:
    """The pretrain recipe (size tiny, 2 replicas) as the CustomJob `mtc recipe run` submits,
    with 2 processes per replica and a restart when a worker dies."""
    sets = ["size=tiny", "parallelism.replicas=2", f"hyperparameters.steps={story.steps}",
            f"checkpoint.every={story.every}"]
    if not reference:
        sets.append(f"hyperparameters.step_sleep_s={story.sleep_s:g}")
    body = custom_job(resolve("pretrain", sets), python=sys.executable, pythonpath=program_pythonpath())
    for pool in body["jobSpec"]["workerPoolSpecs"]:
        pool["containerSpec"]["env"].append({"name": protocol.PROCESSES_PER_NODE,
                                             "value": str(PROCESSES_PER_NODE)})
    body["jobSpec"]["scheduling"] = {"partition": "train", "restartJobOnWorkerRestart": True}
    body["displayName"] += "-reference" if reference else ""
    return body


def run_torch_demo(app: EmbeddedApp, story: TorchStory | None = None) -> Outcome:
    story = story or TorchStory()
    t0 = app.deps.clock.now()
    console.rule("[bold]mtc self-healing demo, PyTorch (embedded: the pretrain recipe, "
                 "2 nodes x 2 ranks, gloo)")
    app.bus.listeners.append(_once_per_report(_printer(t0)))
    saved = _Checkpoints()
    app.bus.listeners.append(saved)
    try:
        return _story(app, story, saved, t0)
    finally:
        app.compute.kill_all()


def _once_per_report(show: Any) -> Any:
    """The timeline, with a node's repeated health report (the agent's, every half second
    while the fault lasts) shown once."""
    from services.presentation.timeline import describe
    from shared.adapters.outbox import envelope_to_doc

    seen: set[str] = set()

    def once(env: Envelope, outcomes: Any) -> None:
        if env.event.TYPE == NodeHealthReported.TYPE:
            key = describe(envelope_to_doc(env))
            if key in seen:
                return
            seen.add(key)
        show(env, outcomes)

    return once


class _Checkpoints:
    """The job's durable checkpoints as they are announced: (attempt, step)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def __call__(self, env: Envelope, _outcomes: Any) -> None:
        data = env.event.to_dict()
        if env.event.TYPE == "mtc.job.checkpoint_saved.v1" and data.get("job_id") == JOB_ID:
            self.seen.append((int(data["attempt"]), int(data["step"])))

    def after(self, attempt: int, step: int) -> bool:
        return any(a == attempt and s > step for a, s in self.seen)


def _story(app: EmbeddedApp, story: TorchStory, saved: _Checkpoints, t0: float) -> Outcome:
    with app.transaction() as uow:
        job_commands.create_cluster(CLUSTER_SPEC, uow, app.deps)
    _wait(app, "cluster READY", lambda: _cluster_ready(app))
    with app.transaction() as uow:
        job_commands.submit_job("demo", recipe_job(story, reference=False), uow, app.deps, JOB_ID)
        job_commands.submit_job("demo", recipe_job(story, reference=True), uow, app.deps,
                                REFERENCE_ID)
    console.print(f"[bold]{JOB_ID}[/]: the pretrain recipe (tiny Llama), {story.steps} steps, "
                  f"a checkpoint every {story.every}; [bold]{REFERENCE_ID}[/]: the same recipe "
                  "and seed, never interrupted")

    # 1. XID 79 mid-interval, once the job has a checkpoint of its own
    _wait(app, "a first checkpoint", lambda: saved.after(1, 0), JOB_ID)
    _pause(app, story.sleep_s * 1.5)
    victim = _job(app, JOB_ID).node_ids[-1]
    console.print(f"[bold magenta]>>> injecting XID 79 (GPU fell off the bus) on {victim}")
    now = app.deps.clock.now()
    app.compute.inject_fault(victim, [Condition(ConditionType.XID_ERROR.value,
                                                ConditionStatus.TRUE, "NVRM: Xid 79", now,
                                                {"xids": [79]})])
    _wait(app, "the job to resume as attempt 2 after the XID 79",
          lambda: _job(app, JOB_ID).attempt >= 2 and _job(app, JOB_ID).state is JobState.RUNNING,
          JOB_ID)
    resumed = max((s for a, s in saved.seen if a == 1), default=0)

    # 2. SIGKILL of one rank mid-interval, once attempt 2 saved past its resume step
    _wait(app, "a checkpoint of attempt 2", lambda: saved.after(2, resumed), JOB_ID)
    _pause(app, story.sleep_s * 1.5)
    rank, pid, node = _a_rank(app, 2)
    console.print(f"[bold magenta]>>> SIGKILL to rank {rank} (pid {pid} on {node})")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait(app, "both jobs to end and the node to return",
          lambda: _job(app, JOB_ID).terminal and _job(app, REFERENCE_ID).terminal
          and _node_state(app, victim) is NodeState.IDLE)
    return _check(app, t0)


def _a_rank(app: EmbeddedApp, attempt: int) -> tuple[int, int, str]:
    """The highest rank's training process of the attempt (under its node's torchrun):
    (rank, pid, node)."""
    found: list[tuple[int, int, str]] = []
    for w in app.compute.workers(JOB_ID):
        if w.attempt != attempt or w.exit_code is not None:
            continue
        for pid in _descendants(w.pid):
            argv = _read(f"/proc/{pid}/cmdline").split(b"\0")
            if PROGRAM.encode() in argv and b"torch.distributed.run" not in argv:
                env = dict(kv.split(b"=", 1) for kv in _read(f"/proc/{pid}/environ").split(b"\0")
                           if b"=" in kv)
                if b"RANK" in env:
                    found.append((int(env[b"RANK"]), pid, w.node_id))
    if not found:
        raise SystemExit(f"demo-torch: no training process of attempt {attempt} found")
    return max(found)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [int(c) for c in _read(f"/proc/{p}/task/{p}/children").split()]
        out += kids
        todo += kids
    return out


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def _check(app: EmbeddedApp, t0: float) -> Outcome:
    import torch
    from safetensors.torch import load_file

    job, ref = _job(app, JOB_ID), _job(app, REFERENCE_ID)
    _, model_dir, logs = output_dirs(job, app.deps)
    _, ref_model, _ = output_dirs(ref, app.deps)
    steps = scalar_steps(Path(logs))
    equal, unequal = False, ["(no model saved)"]
    if (Path(model_dir) / "model.safetensors").is_file() and \
            (Path(ref_model) / "model.safetensors").is_file():
        a = load_file(str(Path(model_dir) / "model.safetensors"))
        b = load_file(str(Path(ref_model) / "model.safetensors"))
        unequal = sorted(set(a) ^ set(b)) + [k for k in a if k in b and not torch.equal(a[k], b[k])]
        equal = not unequal
    out = Outcome(job.state, job.restart_count, steps, equal, unequal, logs, model_dir)
    console.rule("[bold]result")
    ok = "green" if job.state is JobState.SUCCEEDED else "red"
    console.print(f"job {JOB_ID}: [bold {ok}]{job.state.value}[/]  restarts: "
                  f"{job.restart_count}  attempts: {job.attempt}; reference {REFERENCE_ID}: "
                  f"{ref.state.value}")
    first, last = (steps[0], steps[-1]) if steps else (0, 0)
    console.print(f"loss curve: {len(steps)} points, steps {first}..{last}, "
                  + ("[green]continuous, each step once[/]" if out.continuous
                     else "[red]NOT continuous (gaps or repeats)[/]"))
    console.print("final weights vs the uninterrupted run: "
                  + ("[green]equal (torch.equal, every tensor)[/]" if equal
                     else f"[red]DIFFERENT: {', '.join(unequal[:5])}[/]"))
    console.print(f"TensorBoard logs: {logs}  (tensorboard --logdir {logs})")
    console.print(f"model: {model_dir}; reference: {ref_model}")
    console.print(f"demo wall time: {time.time() - t0:.1f} s")
    return out


def scalar_steps(tb: Path, tag: str = "loss") -> list[int]:
    """The steps of every ``tag`` summary in the attempts' event files, sorted (a torn
    record at a file's end, a killed writer's, ends that file)."""
    from tensorboardX.proto.event_pb2 import Event

    steps: list[int] = []
    for path in sorted(tb.glob("attempt-*/events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            if pos + 16 + length > len(data):
                break
            event = Event()
            event.ParseFromString(data[pos + 12: pos + 12 + length])
            steps += [event.step for v in event.summary.value if v.tag == tag]
            pos += 16 + length
    return sorted(steps)


def _pause(app: EmbeddedApp, seconds: float) -> None:
    app.run(lambda: False, timeout_s=seconds, poll_s=0.05)


def _wait(app: EmbeddedApp, what: str, until: Any, *job_ids: str) -> None:
    """Until ``until()``; not past the end of the jobs ``job_ids`` (``demo_wait``)."""
    wait(app, "demo-torch", what, until, jobs=job_ids, timeout_s=TIMEOUT_S, tick_s=2.0)
