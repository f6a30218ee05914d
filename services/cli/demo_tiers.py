"""The second half of `make demo`: recovery from the checkpoint tiers.

After the requeue story, a second job of ``examples/train.py`` runs on the same cluster with
the tiers the local adapter gives every job (``protocol.tier_env``: memory on its node, a
copy on its buddy's node) and heartbeats often enough that the control plane knows its
newest memory and peer entries:

1. **in place**: an XID 13 (a program-level GPU fault: the node stays usable) on one of its
   nodes; triage says restart the job, the recovery policy picks ``in_place``: the next
   attempt starts on the same nodes at once and restores from memory;
2. **hot swap**: one of its nodes is lost (its heartbeat stops, its ranks die, its memory
   goes), a spare is ready: only that node's rank moves to the spare and restores from its
   peer copy, the other from its own memory.

Each time the policy's choice is printed from the job view (``recovery``: mode, why,
expected and measured seconds) with the steps lost (the step at the fault less the step
restored). Stand-in: a simulated node cannot vanish, so the loss is the heartbeat monitor's
finding injected with the ranks SIGKILLed and the node's memory wiped (as ``mtc bench
recovery`` does).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtc_program import protocol
from services.cli.bench_live import RESTORED, kill_ranks
from services.cli.demo_wait import wait
from services.job_submission import commands as job_commands
from services.wiring.embedded import EmbeddedApp
from shared.adapters.compute.protocol import progress_path
from shared.domain.events import Envelope
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.service_layer.gangs import output_dirs

JOB_ID = "train-2"
ROOT = Path(__file__).resolve().parents[2]
STEP_TIME_S = 0.05
TIER1_EVERY = 5  # steps between memory (and peer) saves
DURABLE_EVERY = 100  # rarely: what the tiers save is what in place and hot swap restore
STEPS = 240
# The pin: on this job the policy alone would requeue a lost node, because its durable tier is
# the local disk (a measured restore of ~0 s, where Cloud Storage takes minutes) and a hot swap
# starts its spare as cold as a requeue. Pinned, the policy still decides where a hot swap is
# not allowed (an XID 13 keeps the node: in place) and says why.
MODE_LABEL = "mtc-recovery-mode"
TIMEOUT_S = 60.0


def tiered_job_spec() -> dict[str, Any]:
    machine = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
               "acceleratorCount": 8}
    env = [{"name": protocol.PROGRESS_INTERVAL_S, "value": "0.2"},
           {"name": protocol.TIER1_EVERY, "value": str(TIER1_EVERY)}]
    return {"displayName": "numpy-regression-tiered", "labels": {MODE_LABEL: "hot_swap"},
            "jobSpec": {
        "workerPoolSpecs": [{"machineSpec": machine, "replicaCount": 2, "containerSpec": {
            "imageUri": "local/examples:latest", "env": env,
            "command": [sys.executable, str(ROOT / "examples" / "train.py")],
            "args": ["--steps", str(STEPS), "--checkpoint-every", str(DURABLE_EVERY),
                     "--step-time", str(STEP_TIME_S)]}}],
        "scheduling": {"partition": "train", "restartJobOnWorkerRestart": True}}}


class _Tiers:
    """The job's tier saves as they are announced: (attempt, tier, step)."""

    def __init__(self) -> None:
        self.saves: list[tuple[int, str, int]] = []

    def __call__(self, env: Envelope, _outcomes: Any) -> None:
        data = env.event.to_dict()
        if env.event.TYPE == "mtc.job.checkpoint_saved.v1" and data.get("job_id") == JOB_ID:
            self.saves.append((int(data["attempt"]), str(data.get("tier", "durable")),
                               int(data["step"])))

    def has(self, attempt: int, tier: str, after: int = 0) -> bool:
        return any(a == attempt and t == tier and s > after for a, t, s in self.saves)


def tiers_story(app: EmbeddedApp, cluster_id: str, say: Callable[[str], None]) -> list[
        dict[str, Any]]:
    """Run the in-place and hot-swap stories; the recoveries, as the job view shows them,
    each with ``steps_lost``."""
    tiers = _Tiers()
    app.bus.listeners.append(tiers)
    with app.transaction() as uow:
        job_commands.submit_job(cluster_id, tiered_job_spec(), uow, app.deps, JOB_ID)
    say(f"[bold]{JOB_ID}[/]: examples/train.py with checkpoint tiers: memory (and a peer copy "
        f"on its buddy's node) every {TIER1_EVERY} steps, durable every {DURABLE_EVERY}; "
        f"pinned to hot_swap ({MODE_LABEL}) where the policy allows it: with a local disk "
        "for durable storage it would requeue a lost node")
    out = []
    for attempt, kind in ((1, "xid13"), (2, "node_lost")):
        _wait(app, f"attempt {attempt} to save to memory and its peer",
              lambda a=attempt: _job(app).attempt == a and tiers.has(a, "peer"), JOB_ID)
        job = _job(app)
        at_fault = _chief_step(app, job)
        node = str(job.node_ids[0] if kind == "xid13" else job.node_ids[-1])
        now = app.deps.clock.now()
        if kind == "xid13":
            say(f"[bold magenta]>>> injecting XID 13 (graphics engine exception: the GPU "
                f"stays usable) on {node}, {JOB_ID} at step ~{at_fault}")
            app.compute.inject_fault(node, [Condition(
                ConditionType.XID_ERROR.value, ConditionStatus.TRUE, "NVRM: Xid 13", now,
                {"xids": [13]})])
        else:
            say(f"[bold magenta]>>> {node} lost (heartbeat gone, its rank killed, its memory "
                f"wiped; a spare is ready), {JOB_ID} at step ~{at_fault}")
            app.compute.inject_fault(node, [Condition(
                ConditionType.HEARTBEAT_LOST.value, ConditionStatus.TRUE, "node lost (demo)",
                now, {"silent_for_s": app.deps.config.heartbeat_timeout_s})])
            kill_ranks(app.compute, JOB_ID, job.attempt, node)
            app.compute.wipe_node_memory(node)
        _wait(app, f"the job to resume as attempt {attempt + 1} after the {kind}",
              lambda a=attempt: _resumed(app, a + 1), JOB_ID)
        app.run(lambda: _measured(app), timeout_s=10, poll_s=0.05, tick_s=1.0)
        decision = dict(_job(app).recovery.decisions[-1])
        restored = _restored(app, attempt + 1) or (0, "?")
        newest = max(at_fault, _newest_logged(app, attempt))
        decision.update(steps_lost=max(0, newest - restored[0]), newest_step=newest,
                        restored_step=restored[0], restored_tier=restored[1],
                        nodes_before=list(job.node_ids), nodes_after=list(_job(app).node_ids),
                        kept=_kept(app, attempt))
        out.append(decision)
        _say_decision(say, decision)
    _wait(app, f"{JOB_ID} to end", lambda: _job(app).terminal)
    return out


def _say_decision(say: Callable[[str], None], d: dict[str, Any]) -> None:
    measured = d.get("measured_s")
    say(f"[bold cyan]recovery {d['mode']}[/] ({d.get('incident')}): {d.get('why')}")
    say(f"    expected lost {d.get('expected_lost_s')} s, measured fault-to-resumed "
        f"{measured if measured is not None else '?'} s; restored step {d['restored_step']} "
        f"from the {d['restored_tier']} tier (rank 0), newest step reached {d['newest_step']}: "
        f"steps lost {d['steps_lost']}; nodes "
        f"{', '.join(d['nodes_before'])} -> {', '.join(d['nodes_after'])}; "
        f"ranks restarted in their processes: {d.get('kept', '?')}")


def _kept(app: EmbeddedApp, attempt: int) -> str:
    """How many ranks of the next attempt went on in the process of ``attempt`` (the local
    compute's in-process restart), of how many."""
    workers = app.compute.workers(JOB_ID)
    before = {w.pid for w in workers if w.attempt == attempt}
    after = [w.pid for w in workers if w.attempt == attempt + 1]
    return f"{sum(p in before for p in after)}/{len(after)}"


def _resumed(app: EmbeddedApp, attempt: int) -> bool:
    job = _job(app)
    return bool(job.attempt == attempt and job.recovery.decisions
                and _restored(app, attempt) is not None)


def _measured(app: EmbeddedApp) -> bool:
    decisions = _job(app).recovery.decisions
    return bool(decisions) and decisions[-1].get("measured_s") is not None


def _chief_step(app: EmbeddedApp, job: Any) -> int:
    """Rank 0's step now, from its progress heartbeat (0.2 s old at most)."""
    ckpt, _, _ = output_dirs(job, app.deps)
    try:
        return int(json.loads(progress_path(ckpt, 0).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


STEP_RE = re.compile(r"step (\d+)")


def _newest_logged(app: EmbeddedApp, attempt: int) -> int:
    """The newest step any rank of ``attempt`` logged (its saves, its preemption)."""
    best = 0
    for f in app.compute.log_files(JOB_ID):
        if f.attempt == attempt:
            with contextlib.suppress(OSError):
                text = Path(f.path).read_text(errors="replace")
                best = max([best, *(int(m) for m in STEP_RE.findall(text))])
    return best


def _restored(app: EmbeddedApp, attempt: int) -> tuple[int, str] | None:
    """(step, tier) rank 0 of ``attempt`` restored, from its log (None: not yet)."""
    for f in app.compute.log_files(JOB_ID):
        if f.attempt == attempt and f.rank in (0, None):
            try:
                match = RESTORED.search(Path(f.path).read_text(errors="replace"))
            except OSError:
                continue
            if match:
                tier = match.group(0).split(" the ")[-1].split()[0] if match.group(1) \
                    else "durable"
                return int(match.group(1) or match.group(2)), tier
    return None


def _job(app: EmbeddedApp) -> Any:
    with app.transaction() as uow:
        return uow.jobs.get(JOB_ID)


def _wait(app: EmbeddedApp, what: str, until: Any, *job_ids: str) -> None:
    """Until ``until()``; not past the end of the jobs ``job_ids`` (``demo_wait``)."""
    wait(app, "demo", what, until, jobs=job_ids, timeout_s=TIMEOUT_S, tick_s=1.0)
