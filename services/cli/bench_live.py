"""Play a fault trace against the embedded default, live: real subprocess ranks, real sqlite.

A cluster of the trace's nodes and hot spares comes up in a fresh state directory; a job of
``examples/train.py`` (numpy) with the trace's replicas runs on it; each fault is injected when
its time (or step) comes and the job has trained half a durable interval since it resumed
from the fault before it (a fault right after a checkpoint would lose nothing):

- ``app_crash``: SIGKILL of the rank's program (the launcher records the exit);
- ``xid_13`` / ``xid_79``: the node reports the XID (``FaultInjection``, as ``mtc node fault``);
- ``node_lost``: the node reports its heartbeat lost and its ranks die at once. Stand-in: a
  simulated local node cannot vanish, so the heartbeat monitor's finding is injected through
  ``FaultInjection`` and the ranks are SIGKILLed, rather than the heartbeats stopping;
- ``no_spare_elastic``: every idle node of the cluster is drained by an operator (so no spare
  is ready), then an XID 79; the drained nodes are resumed once the job has resumed.

What the runner saw (the injections, the step each fault found) goes to
:mod:`shared.resilience.score` with the event log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from mtc_program import protocol
from mtc_program.protocol import PROGRESS_DIR  # the ranks' heartbeats
from services.job_submission import commands as job_commands
from services.repair import operator
from services.wiring.embedded import EmbeddedApp, embedded
from shared.domain.errors import MtcError
from shared.domain.events import Envelope
from shared.domain.health import Condition, ConditionStatus, ConditionType, RepairAction
from shared.domain.model import JobState, NodeRole, NodeState
from shared.resilience.bench_config import bench_config
from shared.resilience.score import Injected, RunScore, Sample, score_run
from shared.resilience.trace import Fault, FaultKind, Trace

CLUSTER_ID = "bench"
JOB_ID = "bench-train"
BY = "mtc bench recovery"  # the operator the drains are recorded under
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train.py"
MACHINE = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
           "acceleratorCount": 8}
PIN_LABEL = "mtc-recovery-mode"
ELASTIC_LABEL = "mtc-min-replicas"
RESTORED = re.compile(r"restoring step (\d+) from the \w+ tier|resumed from step (\d+)"
                      # the torch example's: from its own memory, or from a durable checkpoint
                      r"|restore: step (\d+) from this process's memory"
                      rf"|resumed from {re.escape(protocol.CHECKPOINT_PREFIX)}(\d+)")
# the programs a run can train: examples/train.py (numpy) or the torch DDP example (gloo on CPU)
PROGRAMS = {"train": EXAMPLE, "torch": ROOT / "examples" / "torch_inprocess.py"}
ATTEMPT_MARK = re.compile(r"^\[mtc\] job \S+ attempt (\d+): ", re.M)  # slurm/scripts.py
HEARTBEAT_S = 0.2  # the chief's progress heartbeat, at most this often (the tiers library)
TICK_S = 1.0
POLL_S = 0.02


def cluster_spec(trace: Trace) -> dict[str, Any]:
    return {"clusterId": CLUSTER_ID, "displayName": "recovery benchmark",
            "nodePools": [{"id": "h100", "nodeCount": trace.nodes + trace.spares,
                           "spareCount": trace.spares, "machineSpec": MACHINE}],
            "partitions": [{"name": "train", "nodePoolIds": ["h100"]}]}


def job_spec(trace: Trace, pin: str | None, program: str = "train") -> dict[str, Any]:
    j = trace.job
    labels = {ELASTIC_LABEL: str(j.min_replicas)} if j.min_replicas is not None else {}
    if pin:
        labels[PIN_LABEL] = pin
    env = [{"name": protocol.PROGRESS_INTERVAL_S, "value": str(HEARTBEAT_S)}]
    if j.tier1_every:
        env.append({"name": protocol.TIER1_EVERY, "value": str(j.tier1_every)})
    return {"displayName": f"bench-{trace.name}", "labels": labels, "jobSpec": {
        "workerPoolSpecs": [{"machineSpec": MACHINE, "replicaCount": j.replicas,
                             "containerSpec": {
                                 "env": env,
                                 "imageUri": "local/examples:latest",
                                 "command": [sys.executable, str(PROGRAMS[program])],
                                 "args": ["--steps", str(j.steps), "--checkpoint-every",
                                          str(j.checkpoint_every), "--step-time",
                                          f"{j.step_time_s:g}",
                                          *(["--memory-every", str(j.tier1_every)]
                                            if program == "torch" and j.tier1_every else [])]}}],
        "scheduling": {"partition": "train", "restartJobOnWorkerRestart": True}}}


def compute_options(trace: Trace) -> dict[str, Any]:
    repair = {RepairAction.RESET_GPU: min(0.5, trace.repair_s), RepairAction.REBOOT: trace.repair_s,
              RepairAction.REIMAGE: trace.repair_s, RepairAction.REPLACE: trace.repair_s}
    return {"repair_durations_s": repair, "provision_duration_s": 0.2, "agent_interval_s": 0.5,
            "deep_check_duration_s": 0.5}


@dataclass
class _Seen:
    """Progress as it is delivered: checkpoints and attempt starts, with their times."""

    samples: list[Sample] = field(default_factory=list)
    durable: set[Sample] = field(default_factory=set)  # those of durable checkpoints
    starts: list[tuple[float, int, int]] = field(default_factory=list)  # (time, attempt, resume)

    def __call__(self, env: Envelope, _outcomes: Any) -> None:
        data = env.event.to_dict()
        if data.get("job_id") != JOB_ID:
            return
        if env.event.TYPE == "mtc.job.checkpoint_saved.v1":
            sample = (float(data.get("saved_at", env.time)), int(data["attempt"]),
                      int(data["step"]))
            self.samples.append(sample)
            if data.get("tier", "durable") == "durable":
                self.durable.add(sample)
        elif env.event.TYPE == "mtc.job.started.v1":
            self.starts.append((env.time, int(data["attempt"]), int(data.get("resume_step", -1))))


class LiveRun:
    """One play of a trace on one embedded app (a fresh state directory)."""

    def __init__(self, app: EmbeddedApp, trace: Trace, *, pin: str | None,
                 timeout_s: float, say: Any = None, faults: FaultTarget | None = None,
                 program: str = "train") -> None:
        self.app, self.trace, self.pin, self.timeout_s = app, trace, pin, timeout_s
        self.program = program
        self.faults: FaultTarget = faults or LocalFaults(app)
        self.skipped: list[dict[str, Any]] = []
        self._restores: dict[int, int] = {}  # attempt -> the step its rank 0 restored
        self.seen = _Seen()
        self.say = say or (lambda _msg: None)
        app.bus.listeners.append(self.seen)
        self.injected: list[Injected] = []
        self._drained: list[str] = []
        self._progress_dir: Path | None = None
        self.beats: list[Sample] = []  # the chief's heartbeats: (time, attempt, step)

    # ------------------------------------------------------------------ reading state
    def _job(self) -> Any:
        with self.app.transaction() as uow:
            return uow.jobs.get(JOB_ID)

    def _wait(self, what: str, until: Any, timeout_s: float | None = None) -> None:
        if not self.app.run(until, timeout_s=timeout_s or self.timeout_s, poll_s=POLL_S,
                            tick_s=TICK_S):
            raise TimeoutError(f"bench: timed out waiting for {what}")

    def step_now(self, now: float) -> int | None:
        """The newest step of the running attempt: its newest checkpoint advanced by the
        nominal step time, never past the next checkpoint (the program writes no finer
        progress before the tiers' heartbeat; the resume step when it saved none yet)."""
        if not self.seen.starts:
            return None
        started, attempt, resume = self.seen.starts[-1]
        mine = [(t, s) for t, a, s in self.seen.samples if a == attempt]
        beats = self.heartbeats(attempt)
        if beats:  # the chief's own reading, 0.2 s old at most
            return beats[-1][1]
        t0, s0 = max(mine, key=lambda x: x[1]) if mine else (started, max(resume, 0))
        j = self.trace.job
        ahead = int((now - t0) / self.pace()) if mine else 0
        return s0 + min(ahead, j.checkpoint_every - 1)

    def pace(self) -> float:
        """Seconds a step, measured between the newest two checkpoints of one attempt (a
        loaded machine is slower than the nominal step time); else the nominal."""
        s = [x for x in self.seen.samples if x in self.seen.durable]
        for (t0, a0, s0), (t1, a1, s1) in zip(reversed(s[:-1]), reversed(s[1:]), strict=True):
            if a0 == a1 and s1 > s0 and t1 > t0:
                return (t1 - t0) / (s1 - s0)
        return self.trace.job.step_time_s

    def heartbeats(self, attempt: int) -> list[tuple[float, int]]:
        """(time, step) of the chief's progress heartbeats of ``attempt``."""
        self._poll_heartbeat()
        return [(t, s) for t, a, s in self.beats if a == attempt]

    def _poll_heartbeat(self) -> None:
        """Read rank 0's heartbeat (``MTC_PROGRESS_FILE``, beside the job's checkpoints,
        written by the tiers library) and keep each new (time, attempt, step)."""
        if self._progress_dir is None:
            root = Path(self.app.deps.config.output_root)
            self._progress_dir = next(iter(root.rglob(PROGRESS_DIR)), None) if root.is_dir() \
                else None
            if self._progress_dir is None:
                return
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            body = json.loads((self._progress_dir / "rank-0.json").read_text())
            beat = (float(body["time"]), int(body["attempt"]), int(body["step"]))
            if not self.beats or self.beats[-1] != beat:
                self.beats.append(beat)

    def _restored(self, attempt: int) -> int | None:
        """The step rank 0 of ``attempt`` restored, from its log (None: not yet); once read,
        kept (Slurm's one output per job grows with every attempt)."""
        if attempt not in self._restores:
            self._restores.update(self.resumes(attempt))
        return self._restores.get(attempt)

    def _resumed_since(self, at: float) -> bool:
        """The job trains again after the fault at ``at``: an attempt started after it has
        made progress, or the attempt it hit is whole and kept making progress (3 s on)."""
        job = self._job()
        if job is None or job.state is not JobState.RUNNING or not self.seen.starts:
            return False
        started, attempt, _ = self.seen.starts[-1]
        progressed = any(t > max(at, started) and a == attempt for t, a, _ in self.seen.samples)
        beats = self.heartbeats(attempt)
        if started > at and (beats or self.beats):
            restored = self._restored(attempt)  # the chief stepped past what it restored
            return restored is not None and any(s > restored for _, s in beats)
        if started > at:
            return progressed
        whole = self.faults.attempt_whole(JOB_ID, attempt)
        late = any(t > at + 3.0 and a == attempt for t, a, _ in self.seen.samples)
        return whole and late

    # ------------------------------------------------------------------ the run
    def run(self) -> RunScore:
        app = self.app
        with app.transaction() as uow:
            job_commands.create_cluster(cluster_spec(self.trace), uow, app.deps)
        self._wait("the cluster", lambda: self._cluster_ready())
        with app.transaction() as uow:
            job_commands.submit_job(CLUSTER_ID, job_spec(self.trace, self.pin, self.program), uow, app.deps,
                                    JOB_ID)
        self._wait("the job's first checkpoint", lambda: bool(self.seen.samples))
        t0 = self.seen.starts[0][0]
        resumed = self.seen.samples[0][0]
        for index, fault in enumerate(self.trace.faults):
            if self.faults.cannot(fault.kind) is None:  # a skipped fault waits for nothing
                self._wait(f"fault {index}'s moment",
                       lambda f=fault, r=resumed: self._due(f, t0, r))
            if not self._inject(index, fault):
                continue
            self._wait(f"the job to resume after fault {index} ({fault.kind})",
                       lambda at=self.injected[-1].at: self._resumed_since(at))
            resumed = self.app.deps.clock.now()
            self._undo(fault)
        end = app.deps.clock.now()
        with app.transaction() as uow:
            job_commands.cancel_job(JOB_ID, uow, app.deps)
        app.run(lambda: bool(self._job().terminal), timeout_s=15, poll_s=POLL_S, tick_s=TICK_S)
        rows = list(app.deps.event_log.read()) if app.deps.event_log else []
        job = self._job()
        decisions = list(getattr(getattr(job, "recovery", None), "decisions", None) or [])
        score = score_run(rows, JOB_ID, self.injected, label=self.pin or "chosen",
                          target=self.faults.name, decisions=decisions,
                          nodes=self.trace.job.replicas, resumes=self.resumes(), end=end,
                          samples=self.beats, tier_events=not self.beats)
        return replace(score, skipped=tuple(self.skipped), costs=self.costs(rows, job))

    def costs(self, rows: list[dict[str, Any]], job: Any) -> dict[str, Any]:
        """What the control plane weighed: each tier's restore estimate, as the recovery
        policy read it at the end, and the policy inputs the event log shows."""
        from services.cli.bench_inputs import live_costs

        return live_costs(rows, JOB_ID, job, self.app.deps)

    def resumes(self, only: int | None = None) -> dict[int, int]:
        """The step each attempt's rank 0 restored (its log: ``restoring step N from the T
        tier`` or ``resumed from step N``); ``only``: that attempt's alone."""
        out: dict[int, int] = {}
        for attempt, text in attempt_logs(self.app.compute, JOB_ID, only).items():
            match = RESTORED.search(text)
            if match:
                out[attempt] = int(next(g for g in match.groups() if g is not None))
        return out

    def _cluster_ready(self) -> bool:
        with self.app.transaction() as uow:
            c = uow.clusters.get(CLUSTER_ID)
            return c is not None and c.state.value == "READY"

    def _due(self, fault: Fault, t0: float, resumed: float) -> bool:
        """The fault's time (or step) has come, and the job has trained half a durable
        interval since it resumed (a fault right after a checkpoint would lose nothing)."""
        now = self.app.deps.clock.now()
        j = self.trace.job
        if now < resumed + j.checkpoint_every * j.step_time_s / 2:
            return False
        job = self._job()
        if job is None or job.state is not JobState.RUNNING:
            return False
        if fault.at_s is not None:
            return now - t0 >= fault.at_s
        step = self.step_now(now)
        return step is not None and fault.after_step is not None and step >= fault.after_step

    def _node_of(self, fault: Fault) -> str:
        if fault.node is not None:
            return fault.node
        assert fault.rank is not None
        nodes = self._job().node_ids
        return str(nodes[fault.rank % len(nodes)])

    def _inject(self, index: int, fault: Fault) -> bool:
        """Play ``fault`` through the target's seam; False: the target cannot play it (the
        reason goes into the run's ``skipped``)."""
        skip = self.faults.cannot(fault.kind)
        if skip is not None:
            self.skipped.append({"index": index, "kind": fault.kind.value, "reason": skip})
            self.say(f"fault {index}: {fault.kind} skipped on {self.faults.name}: {skip}")
            return False
        node = self._node_of(fault)
        job = self._job()
        if fault.kind is FaultKind.NO_SPARE_ELASTIC:
            self._drain_idle(set(job.node_ids))
        now = self.app.deps.clock.now()
        step = self.step_now(now)
        self.say(f"t+{now - self.seen.starts[0][0]:6.2f}s  fault {index}: {fault.kind} on "
                 f"{node} ({fault.target}; step ~{step})")
        if fault.kind is FaultKind.APP_CRASH:
            self.faults.kill_ranks(JOB_ID, job.attempt, node)
        elif fault.kind is FaultKind.NODE_LOST:
            self.faults.lose_node(JOB_ID, job.attempt, node, now)
        else:
            self.faults.xid(node, 13 if fault.kind is FaultKind.XID_13 else 79, now)
        read = bool(self.heartbeats(job.attempt))
        self.injected.append(Injected(index, fault.kind.value, now, node, fault.rank, step,
                                      step_estimated=not read))
        return True

    def _drain_idle(self, busy: set[str]) -> None:
        """An operator's drain of every idle worker (``mtc node drain``): no spare is ready."""
        with self.app.transaction() as uow:
            self._drained = [n.node_id for n in uow.nodes.list(CLUSTER_ID)
                             if n.node_id not in busy and n.state is NodeState.IDLE
                             and n.role is NodeRole.WORKER]
            for node_id in self._drained:
                operator.act(operator.DRAIN, CLUSTER_ID, node_id,
                             "recovery benchmark: no spare ready", BY, uow, self.app.deps)

    def _undo(self, fault: Fault) -> None:
        if fault.kind is not FaultKind.NO_SPARE_ELASTIC:
            return
        for node_id in self._drained:
            with contextlib.suppress(MtcError), self.app.transaction() as uow:
                operator.act(operator.RESUME, CLUSTER_ID, node_id,
                             "recovery benchmark: the spare is back", BY, uow, self.app.deps)
        self._drained = []


def attempt_logs(compute: Any, job_id: str, only: int | None = None) -> dict[int, str]:
    """Rank 0's log of each attempt (of ``only``): a file of its own on the local compute;
    on Slurm every attempt and rank append to one output, cut here at its attempt lines."""
    out: dict[int, str] = {}
    for f in compute.log_files(job_id):
        if f.rank not in (0, None) or (only is not None and f.attempt != only):
            continue
        with contextlib.suppress(OSError):
            out[f.attempt] = attempt_section(Path(f.path).read_text(errors="replace"),
                                             f.attempt)
    return out


def attempt_section(text: str, attempt: int) -> str:
    """What ``attempt`` wrote to a log several attempts append to: from each of its
    ``[mtc] job J attempt N:`` lines (Slurm's batch.sh) to the next attempt's; the whole
    text when it has none (a log of its own)."""
    marks = list(ATTEMPT_MARK.finditer(text))
    if not marks:
        return text
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return "".join(text[m.start():end] for m, end in zip(marks, ends, strict=True)
                   if int(m.group(1)) == attempt)


class FaultTarget(Protocol):
    """The seam between the runner and a target: how a fault is played on its machines.
    The run's logic (when a fault is due, when the job has resumed, the drains, the score)
    is the same for every target."""

    name: str  # the score's target: "embedded", "slurm"

    def cannot(self, kind: FaultKind) -> str | None:
        """Why this target cannot play ``kind`` (None: it can)."""

    def kill_ranks(self, job_id: str, attempt: int, node_id: str) -> None:
        """SIGKILL the program of every live rank of the attempt on the node."""

    def xid(self, node_id: str, code: int, now: float) -> None:
        """The node's GPU reports XID ``code``."""

    def lose_node(self, job_id: str, attempt: int, node_id: str, now: float) -> None:
        """The node vanishes: its ranks die, its memory (tier 1, peer copies) goes."""

    def attempt_whole(self, job_id: str, attempt: int) -> bool:
        """Every rank of the attempt still runs (a recovery that kept the processes)."""


class LocalFaults:
    """The embedded default's local compute: faults through ``FaultInjection``."""

    name = "embedded"

    def __init__(self, app: EmbeddedApp) -> None:
        self.compute = app.compute
        self.heartbeat_timeout_s = app.deps.config.heartbeat_timeout_s

    def cannot(self, kind: FaultKind) -> str | None:
        return None

    def kill_ranks(self, job_id: str, attempt: int, node_id: str) -> None:
        kill_ranks(self.compute, job_id, attempt, node_id)

    def xid(self, node_id: str, code: int, now: float) -> None:
        self.compute.inject_fault(node_id, [Condition(
            ConditionType.XID_ERROR.value, ConditionStatus.TRUE, f"NVRM: Xid {code}", now,
            {"xids": [code]})])

    def lose_node(self, job_id: str, attempt: int, node_id: str, now: float) -> None:
        self.compute.inject_fault(node_id, [Condition(
            ConditionType.HEARTBEAT_LOST.value, ConditionStatus.TRUE, "node lost (bench)", now,
            {"silent_for_s": self.heartbeat_timeout_s})])
        kill_ranks(self.compute, job_id, attempt, node_id)
        wipe = getattr(self.compute, "wipe_node_memory", None)
        if wipe is not None:  # the node's memory (its tier-1 and peer copies) goes with it
            wipe(node_id)

    def attempt_whole(self, job_id: str, attempt: int) -> bool:
        return all(w.exit_code is None for w in self.compute.workers(job_id)
                   if w.attempt == attempt)


def kill_ranks(compute: Any, job_id: str, attempt: int, node_id: str) -> None:
    """SIGKILL the program of every live rank of the attempt on ``node_id`` (not its
    launcher, which records the exit as a crashed program's)."""
    for w in compute.workers(job_id):
        if w.attempt != attempt or w.node_id != node_id or w.exit_code is not None:
            continue
        pids = _children(w.pid) or [w.pid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def run_embedded(trace: Trace, state_dir: Path, *, pin: str | None, timeout_s: float = 120.0,
                 say: Any = None, program: str = "train") -> RunScore:
    """Play ``trace`` on a fresh embedded app over ``state_dir`` (wiped by the caller)."""
    app = embedded(state_dir, config=bench_config(), compute_options=compute_options(trace))
    try:
        return LiveRun(app, trace, pin=pin, timeout_s=timeout_s, say=say,
                       program=program).run()
    finally:
        app.compute.kill_all()
        app.close()
