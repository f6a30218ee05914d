"""Chaos soak: many jobs, random faults and kills, invariants checked all along.

    python bench/soak.py [--minutes M] [--jobs N] [--nodes K] [--seed S] [--state-dir DIR]

One cluster of K worker nodes (plus a small second cluster, so that "a node owned by two
clusters" can be seen) runs N jobs of ``examples/train.py`` (1, 2 or 4 replicas; mostly short,
some long) on the embedded default. The control loop runs in a child process
(``bench/soak_controller.py``) that the soak SIGKILLs and restarts at random. Chaos, drawn from
one seeded RNG: health faults of every kind on idle and busy nodes (the path ``mtc node
fault`` takes), SIGKILL of one rank / every rank / a launcher, SIGSTOP of a rank (a hang),
controller kills, a second process pumping the bus as CLI commands do, replays of delivered
envelopes (duplicated, delayed, reordered, past the accepted age) and stale health reports
(observed before the node's last repair), job cancellations, operator drains (``mtc node
drain``; a later one resumes the earlier), which mtc must never undo.

Every ``CHECK_EVERY_S`` the invariants below are checked against the control plane's state
*and* the ground truth (LocalCompute's sqlite file: injected faults, worker pids; ``/proc``).
Each violation is recorded once, with the time and the detail. At the end: figures as a table
and as JSON; the exit status is 1 if any invariant was violated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.soak_chaos import TEETH_MUST_HAPPEN, TEETH_WEIGHTS, TOKEN, Teeth  # noqa: E402
from bench.soak_controller import PROGRESS_TIMEOUT_S, open_app  # noqa: E402
from services.cli.commands_local import fault_conditions  # noqa: E402
from services.job_submission import commands as job_commands  # noqa: E402
from services.repair import operator  # noqa: E402
from services.wiring.builder import COMPUTE_SOURCES  # noqa: E402
from services.wiring.embedded import EmbeddedApp  # noqa: E402
from shared.adapters.compute.disk_evidence import space  # noqa: E402
from shared.adapters.outbox import envelope_from_doc, make_envelope  # noqa: E402
from shared.config import ControlPlaneConfig  # noqa: E402
from shared.domain import lifecycle, progress, storage  # noqa: E402
from shared.domain.errors import MtcError  # noqa: E402
from shared.domain.events import Envelope, NodeHealthReported  # noqa: E402
from shared.domain.health import Condition, ConditionStatus, ConditionType  # noqa: E402
from shared.domain.model import Job, JobState, Node, NodeRole, NodeState, Partition  # noqa: E402

# ----------------------------------------------------------------------------- constants
# All times in seconds unless the name says otherwise.
STEP_TIME_S = 0.05  # train.py sleeps this per step
CHECKPOINT_EVERY_STEPS = 10  # a checkpoint every 0.5 s of training
SHORT_STEPS = (30, 120)  # 1.5-6 s of training
LONG_STEPS = (400, 1200)  # 20-60 s of training (capped at a third of the run)
LONG_JOB_FRACTION = 0.25
REPLICA_CHOICES = (1, 1, 2, 2, 4)  # drawn uniformly: sizes 1, 2 and 4
CANCEL_FRACTION = 0.1  # jobs the soak cancels at a random time
RESTART_ANYWAY_FRACTION = 0.5  # jobs whose spec says restartJobOnWorkerRestart
SUBMIT_WINDOW_FRACTION = 0.6  # jobs are submitted over the first 60% of the run
AUX_CLUSTER_NODES = 2  # the second cluster's worker nodes
AUX_JOB_FRACTION = 0.1  # jobs that go to the second cluster
SPARE_NODES = 1  # hot spares of the main cluster (part of --nodes)

CHAOS_MEAN_INTERVAL_S = 1.5  # mean gap between chaos actions (exponential)
CHAOS_WEIGHTS: dict[str, float] = {  # relative odds of each chaos kind
    "fault": 5.0, "worker_kill": 3.0, "controller_kill": 1.0, "cli_pump": 0.7,
    "replay": 2.0, "stale_report": 1.0, "hang": 0.3, "operator_drain": 0.3,
}
FAULT_KINDS = ("xid", "ecc_dbe", "row_remap_failure", "dcgm", "thermal", "disk", "slow")
# XIDs drawn for "xid" faults: reset, reboot, application-level and (rarely) manual ones
XID_CHOICES = (79, 79, 48, 48, 74, 62, 13, 94, 54)
WORKER_KILL_KINDS = ("rank", "all_ranks", "launcher")
REPLAY_KINDS = ("duplicate", "delayed", "reordered", "expired")
# kinds a soak must show at least once: past this fraction of the chaos window, a draw that
# would pick something else picks a missing one instead (a short soak is otherwise left to luck)
CHAOS_MUST_HAPPEN = ("fault", "worker_kill", "controller_kill")
CHAOS_COVERAGE_FROM = 0.3
CONTROLLER_DOWN_S = (0.2, 2.0)  # a killed controller stays down this long
CLI_PUMP_BUDGET_S = 1.0  # a second process pumps this long (as a CLI command does)

CHECK_EVERY_S = 3.0  # invariants checked this often
OPERATOR_DRAINS_AT_ONCE = 1  # a second operator drain lifts the first instead
PROGRESS_EVERY_S = 5.0  # a progress line this often
SETTLE_S = 120.0  # after the chaos: time for every job to end and every node to settle
STUCK_JOB_S = 120.0  # a job with no state change and no new checkpoint this long is stuck
STUCK_NODE_S = 90.0  # a node in a transient state this long is stuck
PLACEMENT_SLACK_S = 3.0  # work started this soon after a fault may not have seen it yet
CAUSE_SLACK_S = 10.0  # a fault this long before a node's return may still explain its drain
STALE_WATCH_S = 20.0  # a drain this soon after a stale report/replay names it in the detail
FINAL_QUIET_S = 20.0  # at the end: a job or node unchanged this long (with room) has not settled
RETENTION_SLACK_S = 20.0  # beyond retention + prune interval before the store is over bound

# the control plane's settings for the soak (passed to the controller child as JSON)
SETTINGS: dict[str, Any] = {
    "grace_period_s": 5.0,
    "heartbeat_timeout_s": 30.0,
    "max_event_age_s": 30.0,
    "retention_s": 30.0,
    "idempotency_retention_s": 30.0,
    "prune_interval_s": 5.0,
    "max_out_of_service_fraction": 0.5,
    "blast_window_s": 30.0,
    "alert_reminder_s": 20.0,  # a held node with the same fault is diagnosed again this often
    "repair_durations_s": {"reset_gpu": 0.5, "reboot": 1.0, "reimage": 2.0, "replace": 2.0},
    "provision_duration_s": 0.3,
    "agent_interval_s": 0.5,
    "controller_poll_s": 0.05,
    "tick_s": 2.0,
}
EVICT_BOUND_S = SETTINGS["grace_period_s"] + 20.0  # a job leaves a faulty node within this
GANG_END_BOUND_S = SETTINGS["grace_period_s"] + 15.0  # one rank dead: the rest end within this
ORPHAN_BOUND_S = SETTINGS["grace_period_s"] + 15.0  # an ended attempt's processes go within this
HELD_BOUND_S = SETTINGS["alert_reminder_s"] + 15.0  # a held node is diagnosed again by then

MAIN, AUX = "soak", "soak-aux"
TRANSIENT = frozenset({NodeState.PROVISIONING, NodeState.DRAINING, NodeState.DRAINED,
                       NodeState.REPAIRING, NodeState.VERIFYING})
OUT_OF_SERVICE = frozenset({NodeState.DRAINING, NodeState.DRAINED, NodeState.REPAIRING,
                            NodeState.VERIFYING, NodeState.FAILED})
TAKES_NODE_OUT = frozenset({"reset_gpu", "reboot", "reimage", "replace", "manual"})
MACHINE = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
           "acceleratorCount": 8}


def cluster_spec(cluster_id: str, nodes: int, spares: int) -> dict[str, Any]:
    return {
        "clusterId": cluster_id, "displayName": f"chaos soak ({cluster_id})",
        "loginNode": {"machineType": "n2-standard-8"},
        "nodePools": [{"id": "gpu", "nodeCount": nodes, "spareCount": spares,
                       "machineSpec": MACHINE}],
        "partitions": [{"name": "train", "nodePoolIds": ["gpu"]}],
    }


def job_spec(replicas: int, steps: int, seed: int, restart_anyway: bool) -> dict[str, Any]:
    return {
        "displayName": f"soak-{replicas}x{steps}",
        "jobSpec": {
            "workerPoolSpecs": [{
                "machineSpec": MACHINE, "replicaCount": replicas,
                "containerSpec": {
                    "imageUri": "local/examples:latest",
                    "command": [sys.executable, str(ROOT / "examples" / "train.py")],
                    "args": ["--steps", str(steps), "--checkpoint-every",
                             str(CHECKPOINT_EVERY_STEPS), "--step-time", str(STEP_TIME_S),
                             "--seed", str(seed)],
                },
            }],
            "scheduling": {"partition": "train", "restartJobOnWorkerRestart": restart_anyway},
        },
    }


def operator_drain(app: EmbeddedApp, node_id: str, verb: str = operator.DRAIN) -> bool:
    """Drain ``node_id`` as an operator would (not mtc): the command ``mtc node drain`` and
    ``:drain`` run (``services.repair.operator``); True when applied. The soak records the
    drain in ``Soak.operator_drained`` and checks that mtc never undoes it. With ``verb``
    ``resume``: the operator lifts it (False while the node is still draining)."""
    try:
        with app.transaction() as uow:
            node = uow.nodes.get(node_id)
            if node is None:
                return False
            operator.act(verb, node.cluster_id, node_id, "soak: operator maintenance",
                         "soak-operator", uow, app.deps)
    except MtcError:
        return False
    return True


# ----------------------------------------------------------------------------- records


def disk_full(path: str, floor: storage.StorageFloor | None = None) -> bool:
    """Whether the file system holding ``path`` is full now by the control plane's floor."""
    found = space(path)
    return found is not None and storage.full(*found, floor or ControlPlaneConfig().storage_floor)


@dataclass
class PlannedJob:
    job_id: str
    cluster_id: str
    replicas: int
    steps: int
    submit_at: float
    cancel_at: float | None
    submitted: bool = False
    restart_anyway: bool = False  # scheduling.restartJobOnWorkerRestart
    cancelled: bool = False  # cancel accepted while the job was live: CANCELLED expected
    killed: bool = False  # the soak SIGKILLed one of its workers (outside the control plane)
    signature: tuple[Any, ...] = ()
    changed_at: float = 0.0
    capacity_since: float | None = None
    final: str = ""


@dataclass
class Violation:
    at: float
    invariant: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"at_s": round(self.at, 1), "invariant": self.invariant, "detail": self.detail}


@dataclass
class ProcInfo:
    pid: int
    state: str
    pgid: int
    cmdline: str


@dataclass
class NodeWatch:
    last_state: NodeState | None = None
    last_in_service_since: float = 0.0
    last_fault_at: float = -math.inf  # a real fault injected by the soak
    last_stale_at: float = -math.inf  # a stale report or a replayed report aimed at it
    bad_count_since: float | None = None
    room_since: float | None = None  # held, and the guard has had room since


@dataclass
class Figures:
    faults: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    replays: Counter[str] = field(default_factory=Counter)
    chaos: Counter[str] = field(default_factory=Counter)
    controller_restarts: int = 0
    checks: int = 0
    checks_by_invariant: Counter[str] = field(default_factory=Counter)
    guard_holds: int = 0
    doc_samples: list[dict[str, Any]] = field(default_factory=list)


def proc_table() -> dict[int, list[ProcInfo]]:
    """Every live (non-zombie) process on this machine, by process group."""
    out: dict[int, list[ProcInfo]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            continue
        info = ProcInfo(int(entry.name), fields[0], int(fields[2]), cmd)
        out.setdefault(info.pgid, []).append(info)
    return out


# ----------------------------------------------------------------------------- the soak


class Soak:
    def __init__(self, *, minutes: float, jobs: int, nodes: int, seed: int, state_dir: Path,
                 settle_s: float = SETTLE_S, stuck_job_s: float = STUCK_JOB_S,
                 stuck_node_s: float = STUCK_NODE_S, quiet: bool = False,
                 jobs_on_small_disk: bool = True) -> None:
        self.duration_s = minutes * 60.0
        self.n_jobs = jobs
        self.n_nodes = nodes
        self.seed = seed
        self.rng = random.Random(seed)
        self.state_dir = state_dir.resolve()
        self.settle_s = settle_s
        self.stuck_job_s = stuck_job_s
        self.stuck_node_s = stuck_node_s
        self.quiet = quiet
        self.fig = Figures()
        self.violations: list[Violation] = []
        self._seen_violations: set[tuple[Any, ...]] = set()
        self.jobs: dict[str, PlannedJob] = {}
        self.watch: dict[str, NodeWatch] = {}
        self.operator_drained: dict[str, float] = {}
        self.orphan_seen: dict[tuple[str, int, int], float] = {}
        self.held_work: set[tuple[str, int, int]] = set()  # ranks on guard-held sick nodes
        self.job_restarts = 0
        self.over_bound: dict[str, tuple[str, float]] = {}
        self.partitions: dict[str, Partition] = {}
        self.hung: dict[str, str] = {}  # job id -> what the soak SIGSTOPped
        self.expected_workers = {MAIN: nodes, AUX: AUX_CLUSTER_NODES}
        self.pool: deque[dict[str, Any]] = deque(maxlen=400)  # delivered envelopes seen
        self.pool_cursor = 0.0
        self.t0 = time.time()
        self.app: EmbeddedApp | None = None
        self.controller: subprocess.Popen[bytes] | None = None
        self.controller_down_until: float | None = None
        self.controller_logs: list[Any] = []
        self.settled = False
        self.last_figures: dict[str, Any] = {}
        self.root = ROOT
        self.outages: list[tuple[float, float | None]] = []  # (start, end or None: ongoing)
        # the controller SIGKILLed until restarted: nothing reports the nodes' faults meanwhile
        self.controller_outages: list[tuple[float, float | None]] = []
        # disk full, damaged state, stalled clients, a locked store
        self.teeth = Teeth(self, jobs_on_small_disk=jobs_on_small_disk)

    # ------------------------------------------------------------------ plumbing

    def now(self) -> float:
        return time.time()

    def rel(self, t: float | None = None) -> float:
        return (t if t is not None else self.now()) - self.t0

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{self.rel():7.1f}s] {text}", flush=True)

    def violate(self, key: tuple[Any, ...], invariant: str, detail: str) -> None:
        if key in self._seen_violations:
            return
        self._seen_violations.add(key)
        v = Violation(self.rel(), invariant, detail)
        self.violations.append(v)
        self.say(f"VIOLATION {invariant}: {detail}")

    def elapsed(self, since: float, now: float, *, blind: bool = False) -> float:
        """Seconds from ``since`` to ``now`` the control plane could act in: the soak's own
        planned outages (a damaged state being restored) do not count against its bounds;
        with ``blind``, nor does the time the controller was down (it is what reads the
        nodes' faults, so no one could know of a fault then)."""
        spans = sorted((max(a, since), min(b if b is not None else now, now))
                       for a, b in (self.outages + self.controller_outages if blind
                                    else self.outages))
        out, reach = 0.0, since
        for a, b in spans:  # the union of the spans, so overlaps count once
            a = max(a, reach)
            if b > a:
                out += b - a
                reach = b
        return now - since - out

    def check(self, invariant: str) -> None:
        self.fig.checks += 1
        self.fig.checks_by_invariant[invariant] += 1

    @property
    def a(self) -> EmbeddedApp:
        assert self.app is not None
        return self.app

    @contextlib.contextmanager
    def compute_db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.state_dir / "compute" / "compute.sqlite3", timeout=30.0)
        db.row_factory = sqlite3.Row
        try:
            yield db
        finally:
            db.close()

    def start_controller(self) -> None:
        log = open(self.state_dir / f"controller-{self.fig.controller_restarts}.log", "ab")  # noqa: SIM115
        self.controller_logs.append(log)
        self.controller = subprocess.Popen(
            self.controller_argv(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env={**os.environ, "MTC_API_TOKEN": TOKEN})

    def controller_argv(self) -> list[str]:
        """The controller is the soak's `mtc serve` (its API on ``teeth.port``)."""
        return [sys.executable, "-m", "bench.soak_controller", "--state-dir",
                str(self.state_dir), "--settings", json.dumps(SETTINGS),
                "--port", str(self.teeth.port)]

    def reopen(self) -> None:
        """The soak's own handle on the state, opened again (after a restore)."""
        if self.app is not None:
            self.app.close()
        self.app = open_app(self.state_dir, SETTINGS)

    def stop_controller(self, sig: int = signal.SIGTERM) -> None:
        proc, self.controller = self.controller, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    # ------------------------------------------------------------------ set-up

    def plan_jobs(self) -> None:
        window = self.duration_s * SUBMIT_WINDOW_FRACTION
        long_cap = max(SHORT_STEPS[1], int(self.duration_s / 3 / STEP_TIME_S))
        for i in range(self.n_jobs):
            aux = self.rng.random() < AUX_JOB_FRACTION
            replicas = self.rng.choice((1, 2)) if aux else self.rng.choice(REPLICA_CHOICES)
            if self.rng.random() < LONG_JOB_FRACTION:
                steps = min(long_cap, self.rng.randint(*LONG_STEPS))
            else:
                steps = self.rng.randint(*SHORT_STEPS)
            submit_at = 0.0 if i < max(1, self.n_jobs // 4) else self.rng.uniform(0, window)
            cancel_at = (submit_at + self.rng.uniform(1.0, 10.0)
                         if self.rng.random() < CANCEL_FRACTION else None)
            job_id = f"soak-j{i:03d}"
            self.jobs[job_id] = PlannedJob(job_id, AUX if aux else MAIN, replicas, steps,
                                           submit_at, cancel_at,
                                           restart_anyway=self.rng.random() < RESTART_ANYWAY_FRACTION)

    def setup(self) -> None:
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        self.state_dir.mkdir(parents=True)
        self.teeth.mount()
        self.app = open_app(self.state_dir, SETTINGS)
        with self.a.transaction() as uow:
            job_commands.create_cluster(cluster_spec(MAIN, self.n_nodes, SPARE_NODES), uow, self.a.deps)
            job_commands.create_cluster(cluster_spec(AUX, AUX_CLUSTER_NODES, 0), uow, self.a.deps)
        self.start_controller()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with self.a.transaction() as uow:
                states = [uow.clusters.get(c) for c in (MAIN, AUX)]
            if all(c is not None and c.state.value == "READY" for c in states):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("soak: the clusters did not become READY within 120 s")
        self.plan_jobs()
        self.t0 = self.now()
        self.say(f"clusters READY: {MAIN} ({self.n_nodes} workers, {SPARE_NODES} spare), "
                 f"{AUX} ({AUX_CLUSTER_NODES}); {self.n_jobs} jobs over "
                 f"{self.duration_s:.0f} s, seed {self.seed}")

    # ------------------------------------------------------------------ the run

    def run(self) -> int:
        try:
            self.setup()
            self.loop()
            self.settle()
            self.final_checks()
        finally:
            self.cleanup()
        self.report()
        return 1 if self.violations else 0

    def loop(self) -> None:
        end = self.t0 + self.duration_s
        next_chaos = self.now() + self.rng.expovariate(1 / CHAOS_MEAN_INTERVAL_S)
        next_check = self.now() + CHECK_EVERY_S
        next_progress = self.now() + PROGRESS_EVERY_S
        while self.now() < end:
            self.keep_controller()
            self.submit_and_cancel()
            if self.now() >= next_chaos:
                self.chaos(covering=self.now() >= self.t0 + CHAOS_COVERAGE_FROM * self.duration_s)
                next_chaos = self.now() + self.rng.expovariate(1 / CHAOS_MEAN_INTERVAL_S)
            if self.now() >= next_check:
                self.check_all()
                next_check = self.now() + CHECK_EVERY_S
            if self.now() >= next_progress:
                self.progress()
                next_progress = self.now() + PROGRESS_EVERY_S
            time.sleep(0.05)

    def settle(self) -> None:
        """No more chaos: every job must end and every node settle, checks still running."""
        self.controller_down_until = min(self.controller_down_until or 0, self.now())
        self.keep_controller()
        for planned in self.jobs.values():  # whatever was not submitted yet goes now
            planned.submit_at = min(planned.submit_at, self.rel())
        self.submit_and_cancel()
        self.say("chaos over: settling")
        deadline = self.now() + self.settle_s
        next_progress = self.now() + PROGRESS_EVERY_S
        while self.now() < deadline:
            self.keep_controller()
            self.check_all()
            for node_id in list(self.operator_drained):  # the operator's maintenance ends
                self.operator_resume(node_id)
            if self.all_settled():
                self.settled = True
                break
            if self.now() >= next_progress:
                self.progress()
                next_progress = self.now() + PROGRESS_EVERY_S
            time.sleep(1.0)
        self.progress()

    def keep_controller(self) -> None:
        if self.controller is not None and self.controller.poll() is not None:
            self.violate(("controller-exit", self.fig.controller_restarts), "controller alive",
                         f"the controller exited by itself with {self.controller.returncode} "
                         f"(log {self.state_dir}/controller-{self.fig.controller_restarts}.log)")
            self.controller = None
            self.controller_down_until = self.now()
            self.controller_outages.append((self.now(), None))
        if self.controller is None and self.controller_down_until is not None \
                and self.now() >= self.controller_down_until:
            self.fig.controller_restarts += 1
            self.start_controller()
            self.controller_down_until = None
            if self.controller_outages and self.controller_outages[-1][1] is None:
                self.controller_outages[-1] = (self.controller_outages[-1][0], self.now())

    def submit_and_cancel(self) -> None:
        t = self.rel()
        for p in self.jobs.values():
            if not p.submitted and p.submit_at <= t:
                spec = job_spec(p.replicas, p.steps, self.rng.randint(0, 1000), p.restart_anyway)
                with self.a.transaction() as uow:
                    job_commands.submit_job(p.cluster_id, spec, uow, self.a.deps, p.job_id)
                p.submitted = True
                p.changed_at = self.now()
            if p.submitted and p.cancel_at is not None and p.cancel_at <= t:
                p.cancel_at = None
                with self.a.transaction() as uow:
                    job = uow.jobs.get(p.job_id)
                    if job is not None and not job.terminal:
                        job_commands.cancel_job(p.job_id, uow, self.a.deps)
                        p.cancelled = True
                        self.fig.chaos["cancel"] += 1

    # ------------------------------------------------------------------ chaos

    def chaos(self, covering: bool = False) -> None:
        weights = {**CHAOS_WEIGHTS, **{k: TEETH_WEIGHTS[k] for k in self.teeth.kinds()}}
        kinds = list(weights)
        kind = self.rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
        must = [*CHAOS_MUST_HAPPEN, *(k for k in TEETH_MUST_HAPPEN if k in weights)]
        missing = [k for k in must if not self.fig.chaos[k]]
        if covering and missing and kind not in missing:
            kind = missing[0]
        done = getattr(self if hasattr(self, f"chaos_{kind}") else self.teeth, f"chaos_{kind}")()
        if done:
            self.fig.chaos[kind] += 1

    def live_workers(self) -> list[Node]:
        with self.a.transaction() as uow:
            nodes = [*uow.nodes.list(MAIN), *uow.nodes.list(AUX)]
        return [n for n in nodes if n.role is NodeRole.WORKER and n.state is not NodeState.RETIRED]

    def chaos_fault(self) -> bool:
        nodes = self.live_workers()
        if not nodes:
            return False
        node = self.rng.choice(nodes)
        kind = self.rng.choice(FAULT_KINDS)
        ns = argparse.Namespace(xid=None, ecc_dbe=None, row_remap_failure=False, dcgm_fail=None,
                                thermal=None, disk=None, slow=None)
        if kind == "xid":
            ns.xid = [self.rng.choice(XID_CHOICES)]
        elif kind == "ecc_dbe":
            ns.ecc_dbe = self.rng.randint(1, 4)
        elif kind == "row_remap_failure":
            ns.row_remap_failure = True
        elif kind == "dcgm":
            ns.dcgm_fail = self.rng.randint(1, 4)
        elif kind == "thermal":
            ns.thermal = self.rng.choice((85.0, 95.0))
        elif kind == "disk":
            ns.disk = self.rng.choice((0.93, 0.99))
        else:
            ns.slow = self.rng.choice((0.3, 0.7))
        return self.inject(node, ns, f"xid{ns.xid[0]}" if kind == "xid" else kind)

    def inject(self, node: Node, ns: argparse.Namespace | None = None, label: str = "xid79"
               ) -> bool:
        """A health fault on ``node`` (default an XID 79) as `mtc node fault` injects it."""
        if ns is None:
            ns = argparse.Namespace(xid=[79], ecc_dbe=None, row_remap_failure=False,
                                    dcgm_fail=None, thermal=None, disk=None, slow=None)
        conditions = fault_conditions(ns, self.now())
        try:
            self.a.compute.inject_fault(node.node_id, conditions)
        except LookupError:
            return False
        self.fig.faults[label] += 1
        self.fig.faults["on busy node" if node.job_id else "on idle node"] += 1
        self.watch.setdefault(node.node_id, NodeWatch()).last_fault_at = self.now()
        return True

    def live_attempts(self) -> list[list[sqlite3.Row]]:
        with self.compute_db() as db:
            rows = db.execute(
                "SELECT w.* FROM workers w JOIN attempts a ON a.job_id = w.job_id AND"
                " a.attempt = w.attempt WHERE a.finalized = 0 ORDER BY w.job_id, w.attempt,"
                " w.rank").fetchall()
        by: dict[tuple[str, int], list[sqlite3.Row]] = {}
        for r in rows:
            by.setdefault((r["job_id"], r["attempt"]), []).append(r)
        return list(by.values())

    @staticmethod
    def rank_pids(launcher: int, procs: dict[int, list[ProcInfo]]) -> list[ProcInfo]:
        """The rank's program: the launcher's group less the launcher."""
        return [p for p in procs.get(launcher, []) if p.pid != launcher]

    def chaos_worker_kill(self) -> bool:
        attempts = self.live_attempts()
        if not attempts:
            return False
        ranks = self.rng.choice(attempts)
        kind = self.rng.choice(WORKER_KILL_KINDS)
        procs = proc_table()
        targets: list[int] = []
        if kind == "rank":
            targets = [p.pid for p in self.rank_pids(self.rng.choice(ranks)["pid"], procs)]
        elif kind == "all_ranks":
            targets = [p.pid for r in ranks for p in self.rank_pids(r["pid"], procs)]
        else:
            launcher = self.rng.choice(ranks)["pid"]
            targets = [launcher] if procs.get(launcher) else []
        if not targets:
            return False
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.fig.kills[f"worker {kind}"] += 1
        planned = self.jobs.get(ranks[0]["job_id"])
        if planned is not None:
            planned.killed = True
        return True

    def chaos_hang(self) -> bool:
        attempts = self.live_attempts()
        if not attempts:
            return False
        rank = self.rng.choice(self.rng.choice(attempts))
        targets = self.rank_pids(rank["pid"], proc_table())
        for p in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGSTOP)
        if targets:
            self.fig.kills["worker hang (SIGSTOP)"] += 1
            self.hung[rank["job_id"]] = (f"the soak SIGSTOPped rank {rank['rank']} of attempt "
                                         f"{rank['attempt']} at {self.rel():.0f} s")
        return bool(targets)

    def chaos_controller_kill(self) -> bool:
        proc = self.controller
        if proc is None or proc.poll() is not None:
            return False
        proc.kill()  # SIGKILL, wherever it is (mid-pump, mid-transaction)
        proc.wait(timeout=10)
        self.controller = None
        self.controller_down_until = self.now() + self.rng.uniform(*CONTROLLER_DOWN_S)
        self.controller_outages.append((self.now(), None))
        self.fig.kills["controller SIGKILL"] += 1
        return True

    def chaos_cli_pump(self) -> bool:
        """A second deliverer, as every `mtc` command that pumps after itself is."""
        self.a.pump(budget_s=CLI_PUMP_BUDGET_S)
        return True

    def refresh_pool(self) -> None:
        log = self.a.deps.event_log
        if log is None:
            return
        for doc in log.read(since=self.pool_cursor):
            if doc["time"] < self.pool_cursor:
                continue
            if self.rng.random() < 0.2:
                self.pool.append(doc)
            self.pool_cursor = max(self.pool_cursor, doc["time"])
        self.pool_cursor += 1e-6

    def chaos_replay(self) -> bool:
        self.refresh_pool()
        now = self.now()
        age_max = SETTINGS["max_event_age_s"]
        kind = self.rng.choice(REPLAY_KINDS)
        bands = {"duplicate": (0.0, 5.0), "delayed": (10.0, age_max - 5.0),
                 "reordered": (0.0, age_max - 5.0), "expired": (age_max + 5.0, math.inf)}
        lo, hi = bands[kind]
        docs = [d for d in self.pool if lo <= now - d["time"] < hi]
        if not docs:
            return False
        batch = self.rng.sample(docs, min(len(docs), 6 if kind == "reordered" else 2))
        if kind == "reordered":
            batch.sort(key=lambda d: d["time"], reverse=True)
        for doc in batch:
            env = envelope_from_doc(doc)
            if isinstance(env.event, NodeHealthReported):
                self.watch.setdefault(env.event.node_id, NodeWatch()).last_stale_at = now
            self.a.bus.inject(env)
        self.fig.replays[kind] += len(batch)
        return True

    def chaos_stale_report(self) -> bool:
        """A report of a fault observed *before* the node's last repair, delivered now."""
        with self.compute_db() as db:
            rows = db.execute(
                "SELECT r.node_id, max(r.completed_at) AS done FROM repairs r WHERE"
                " r.completed_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM faults f WHERE"
                " f.node_id = r.node_id) GROUP BY r.node_id").fetchall()
        in_service = {n.node_id for n in self.live_workers() if n.in_service}
        rows = [r for r in rows if r["node_id"] in in_service]
        if not rows:
            return False
        row = self.rng.choice(rows)
        observed = float(row["done"]) - self.rng.uniform(0.5, 5.0)
        conds = [Condition(t.value, ConditionStatus.FALSE, "ok", observed)
                 for t in ConditionType if t is not ConditionType.XID_ERROR]
        conds.append(Condition(ConditionType.XID_ERROR.value, ConditionStatus.TRUE,
                               "NVRM: Xid 79 (stale)", observed - 1.0, {"xids": [79]}))
        event = NodeHealthReported(row["node_id"], observed, tuple(c.to_dict() for c in conds),
                                   source="agent")
        env: Envelope = make_envelope(event, COMPUTE_SOURCES["local"], self.now())
        self.a.bus.inject(env)
        self.watch.setdefault(row["node_id"], NodeWatch()).last_stale_at = self.now()
        self.fig.replays["stale report"] += 1
        return True

    def chaos_operator_drain(self) -> bool:
        if len(self.operator_drained) >= OPERATOR_DRAINS_AT_ONCE:
            return self.operator_resume(min(self.operator_drained,
                                            key=self.operator_drained.__getitem__))
        nodes = [n for n in self.live_workers() if n.in_service]
        if not nodes:
            return False
        node = self.rng.choice(nodes)
        if operator_drain(self.a, node.node_id):
            self.operator_drained[node.node_id] = self.now()
            self.fig.chaos["operator drain (done)"] += 1
            return True
        self.fig.chaos["operator drain (refused)"] += 1
        return False

    def operator_resume(self, node_id: str) -> bool:
        """The operator lifts their drain (from then on mtc may return the node)."""
        if not operator_drain(self.a, node_id, operator.RESUME):
            return False
        self.operator_drained.pop(node_id, None)
        self.fig.chaos["operator resume"] += 1
        return True

    # ------------------------------------------------------------------ invariants

    def read_state(self) -> tuple[dict[str, list[Node]], dict[str, Job]]:
        with self.a.transaction() as uow:
            nodes = {c: list(uow.nodes.list(c)) for c in (MAIN, AUX)}
            jobs = {j.job_id: j for j in uow.jobs.list()}
            self.partitions = {p.key: p for c in (MAIN, AUX) for p in uow.partitions.list(c)}
        return nodes, jobs

    def guard_room(self, n: Node, now: float) -> bool:
        """Whether the blast-radius guard would let one more node of ``n``'s partition out
        (the same two limits as ``shared.policies.repair._guard``)."""
        part = self.partitions.get(f"{n.cluster_id}:{n.partition}")
        if part is None:
            return False
        allowed = max(1, math.floor(SETTINGS["max_out_of_service_fraction"]
                                    * part.total_nodes + 1e-9))
        recent = sum(1 for t in part.removed_at if now - SETTINGS["blast_window_s"] <= t <= now)
        return bool(part.down + 1 <= allowed and recent + 1 <= allowed)

    def check_held(self, n: Node, cluster_id: str, takes_out: set[str], now: float) -> None:
        """A node the guard held (SUSPECT) with a fault that takes it out must be taken out
        once the guard has room: it is diagnosed again every ``alert_reminder_s``."""
        w = self.watch.setdefault(n.node_id, NodeWatch())
        if n.node_id not in takes_out or not self.guard_room(n, now):
            w.room_since = None
            return
        w.room_since = w.room_since or now
        if self.elapsed(w.room_since, now) > HELD_BOUND_S:
            part = self.partitions.get(f"{n.cluster_id}:{n.partition}")
            self.violate(("held", n.node_id, n.since),
                         "a held node is taken out once there is room",
                         f"{n.node_id} SUSPECT (held by the blast-radius guard, alert "
                         f"{n.alert!r}) for {now - n.since:.0f} s with a fault that takes it "
                         f"out; the guard has had room for {now - w.room_since:.0f} s "
                         f"({part.down if part else '?'} of {part.total_nodes if part else '?'}"
                         f" of {cluster_id} down)")

    def check_all(self) -> None:
        try:
            nodes, jobs = self.read_state()
            with self.compute_db() as db:
                faults = db.execute("SELECT * FROM faults").fetchall()
                workers = db.execute("SELECT * FROM workers").fetchall()
                parked = {(r["pid"], r["start_ticks"]): float(r["deadline"]) for r in db.execute(
                    "SELECT pid, start_ticks, deadline FROM parked")} if db.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'parked'").fetchone() else {}
                machines = db.execute("SELECT node_id, deleted FROM nodes").fetchall()
        except sqlite3.OperationalError as exc:  # a lock held past 30 s: say so, go on
            self.say(f"check skipped: {exc}")
            return
        procs = proc_table()
        now = self.now()
        self.check_jobs(nodes, jobs, now)
        self.check_nodes(nodes, jobs, machines, faults, now)
        self.check_placement(nodes, jobs, faults, workers, procs, now)
        self.check_gangs(jobs, workers, procs, now, parked)
        self.check_retention(now)

    def room(self, nodes: dict[str, list[Node]], jobs: dict[str, Job],
             now: float) -> dict[str, tuple[bool, str]]:
        """For every waiting (QUEUED/PENDING) job: whether the scheduling policy lets it
        start now, and why (or why not). Stated apart from the scheduler, from its documented
        policy (``shared/policies/scheduling.py``, ``services/job_submission/scheduling.py
        schedule``), node counts only (every soak node has one shape):

        * capacity is the cluster's IDLE workers that take work (``lifecycle.takes_work``: no
          active fault, not held, not operator-drained), in the job's partition, less the
          job's excluded nodes; a fresh job (no restart yet) never takes a spare;
        * a job backing off (``recovery.not_before`` in the future) is not a candidate until
          then, and blocks nothing;
        * a job a full disk interrupted (``recovery.storage_full``) is not a candidate while
          that file system is still full (read here with ``statvfs``), and blocks nothing;
        * a job whose every rank still holds a node that takes work starts at once;
        * strict gang FIFO per partition (priority, then submission time, then id): a job
          that cannot be placed blocks every later job of its partition, which then waits
          its turn. The head must not stay blocked while enough nodes take work for it."""
        out: dict[str, tuple[bool, str]] = {}
        for cluster_id, members in nodes.items():
            by_id = {n.node_id: n for n in members}
            free = {n.node_id: n for n in members if n.role is NodeRole.WORKER
                    and n.state is NodeState.IDLE and lifecycle.takes_work(n)}
            waiting = sorted((j for j in jobs.values() if j.cluster_id == cluster_id
                              and j.state in (JobState.QUEUED, JobState.PENDING)),
                             key=lambda j: (-j.priority, j.created_at, j.job_id))
            blocked: dict[str | None, str] = {}  # partition (None: every one) -> head job
            for job in waiting:
                part = job.spec.scheduling.partition
                nb = job.recovery.not_before
                if nb is not None and nb > now:
                    out[job.job_id] = (False, f"backing off until {self.rel(nb):.0f} s")
                    continue
                if job.recovery.storage_full and disk_full(job.recovery.storage_full):
                    out[job.job_id] = (False, f"waits for room at {job.recovery.storage_full}")
                    continue
                head = blocked.get(None) or (blocked.get(part) if part is not None
                                             else next(iter(blocked.values()), None))
                if head is not None:
                    out[job.job_id] = (False, f"waits its FIFO turn behind {head}")
                    continue
                kept = [n for n in job.node_ids if n and n in by_id and by_id[n].job_id ==
                        job.job_id and lifecycle.takes_work(by_id[n])]
                holes = (len(job.node_ids) if job.node_ids else job.spec.replica_count) \
                    - len(kept)
                resume = job.restart_count > 0
                excluded = set(job.recovery.excluded_node_ids)
                eligible = [n for n in free.values()
                            if (part is None or n.partition == part)
                            and n.node_id not in excluded and (resume or not n.is_spare)]
                previous = set(job.previous_node_ids)
                eligible.sort(key=lambda n: (n.node_id not in previous,
                                             not n.is_spare, n.node_id))
                if len(eligible) >= holes:
                    for n in eligible[:holes]:
                        del free[n.node_id]
                    out[job.job_id] = (True, f"{len(eligible)} node(s) take work for its "
                                             f"{holes} hole(s)")
                    continue
                blocked[part] = job.job_id
                out[job.job_id] = (False, f"head of its partition's queue: {holes} hole(s), "
                                          f"{len(eligible)} node(s) take work for it")
        return out

    def check_jobs(self, nodes: dict[str, list[Node]], jobs: dict[str, Job], now: float) -> None:
        room = self.room(nodes, jobs, now)
        for p in self.jobs.values():
            if not p.submitted:
                continue
            job = jobs.get(p.job_id)
            self.check("job accounted for")
            if job is None:
                self.violate(("job-missing", p.job_id), "job accounted for",
                             f"{p.job_id} was submitted and is not in the store")
                continue
            if job.terminal:
                if not p.final:
                    p.final = job.state.value
                    self.check_final(p, job)
                continue
            latest = job.latest_checkpoint
            sig = (job.state, job.attempt, latest.step if latest else -1, tuple(job.node_ids))
            if sig != p.signature:
                p.signature, p.changed_at = sig, now
            waiting = job.state in (JobState.QUEUED, JobState.PENDING)
            has_room, why = room.get(job.job_id, (True, ""))
            if waiting and not has_room:
                p.capacity_since = None
            elif p.capacity_since is None:
                p.capacity_since = now
            self.check("job makes progress")
            quiet_s = self.elapsed(p.changed_at, now)
            if waiting and p.capacity_since is not None:
                quiet_s = min(quiet_s, self.elapsed(p.capacity_since, now))
            if p.capacity_since is not None and quiet_s > self.stuck_job_s:
                self.violate(("stuck-job", p.job_id, sig), "job makes progress",
                             f"{p.job_id} ({p.replicas}x{p.steps} steps) {job.state.value} "
                             f"attempt {job.attempt}, last checkpoint step "
                             f"{latest.step if latest else None}, no change for "
                             f"{now - p.changed_at:.0f} s with capacity for it "
                             f"(nodes {job.node_ids}{'; ' + why if waiting else ''})"
                             f"{self.hang_note(p.job_id)}")

    def hang_note(self, job_id: str) -> str:
        return f"; {self.hung[job_id]}" if job_id in self.hung else ""

    def check_final(self, p: PlannedJob, job: Job) -> None:
        self.check("job ends as program and policy say")
        if p.cancelled:
            ok = job.state is JobState.CANCELLED
            want = "CANCELLED (cancelled while live)"
        else:
            gave_up = job.state is JobState.FAILED and job.error.startswith("gave up after") \
                and job.restart_count >= job.spec.scheduling.max_restarts
            # a SIGKILL neither the control plane nor a node fault explains is the program's
            # failure (shared/domain/exits.py): FAILED naming the signal is policy too,
            # unless the spec asks to restart anyway
            own_failure = p.killed and not p.restart_anyway and job.state is JobState.FAILED \
                and ("137" in job.error or "SIGKILL" in job.error)
            ok = job.state is JobState.SUCCEEDED or gave_up or own_failure
            if own_failure:
                p.final = f"{job.state.value} (worker SIGKILLed by the soak: policy)"
            want = ("SUCCEEDED (train.py exits 0 when let run)" if not p.killed else
                    "SUCCEEDED" + ("" if p.restart_anyway else
                                   ", or FAILED naming the SIGKILL the soak sent"))
        if not ok:
            self.violate(("final", p.job_id), "job ends as program and policy say",
                         f"{p.job_id} ({p.replicas}x{p.steps} steps) ended "
                         f"{job.state.value}, want {want}; restarts {job.restart_count}, "
                         f"restartJobOnWorkerRestart {p.restart_anyway}, "
                         f"error: {job.error!r}")

    def check_nodes(self, nodes: dict[str, list[Node]], jobs: dict[str, Job],
                    machines: list[sqlite3.Row], faults: list[sqlite3.Row], now: float) -> None:
        owner: dict[str, str] = {}
        live_machines = {r["node_id"] for r in machines if not r["deleted"]}
        faulty = {r["node_id"] for r in faults}
        takes_out = {r["node_id"] for r in faults if r["needs"] in TAKES_NODE_OUT}
        for cluster_id, members in nodes.items():
            workers = [n for n in members if n.role is NodeRole.WORKER]
            self.check("no node lost")
            count = sum(1 for n in workers if n.state is not NodeState.RETIRED)
            key = ("count", cluster_id)
            w = self.watch.setdefault(f"cluster:{cluster_id}", NodeWatch())
            if count != self.expected_workers[cluster_id]:
                w.bad_count_since = w.bad_count_since or now
                if self.elapsed(w.bad_count_since, now) > self.stuck_node_s:
                    self.violate((*key, count), "no node lost",
                                 f"{cluster_id} has {count} worker nodes not retired, its spec "
                                 f"says {self.expected_workers[cluster_id]}, for "
                                 f"{now - w.bad_count_since:.0f} s")
            else:
                w.bad_count_since = None
            for n in members:
                self.check("no node owned by two clusters")
                if n.cluster_id != cluster_id or owner.get(n.node_id, cluster_id) != cluster_id:
                    self.violate(("owner", n.node_id), "no node owned by two clusters",
                                 f"{n.node_id} listed under {cluster_id} and "
                                 f"{owner.get(n.node_id, n.cluster_id)}")
                owner[n.node_id] = cluster_id
                if n.state is NodeState.RETIRED:
                    continue
                if n.role is NodeRole.WORKER and n.state is not NodeState.PROVISIONING:
                    self.check("no node lost")
                    if n.node_id not in live_machines:
                        self.violate(("machine", n.node_id), "no node lost",
                                     f"{n.node_id} is {n.state.value} in the control plane "
                                     "but has no machine in LocalCompute")
                if n.job_id:
                    job = jobs.get(n.job_id)
                    self.check("no node owned by two clusters")
                    if job is not None and job.cluster_id != cluster_id:
                        self.violate(("job-owner", n.node_id, n.job_id),
                                     "no node owned by two clusters",
                                     f"{n.node_id} of {cluster_id} runs {n.job_id} of "
                                     f"{job.cluster_id}")
                self.check("no node stuck")
                parked = n.node_id in self.operator_drained and n.state is NodeState.DRAINED
                if n.state in TRANSIENT and self.elapsed(n.since, now) > self.stuck_node_s \
                        and not parked:
                    self.violate(("stuck-node", n.node_id, n.since), "no node stuck",
                                 f"{n.node_id} {n.state.value} for {now - n.since:.0f} s "
                                 f"(repair {n.repair_action}, reason {n.reason!r})")
                if n.state is NodeState.SUSPECT:
                    self.fig.guard_holds += 1
                    self.check("a held node is taken out once there is room")
                    self.check_held(n, cluster_id, takes_out, now)
                self.check_drain_cause(n, faulty, now)
        for nid in live_machines - set(owner):
            self.check("no node lost")
            self.violate(("leaked", nid), "no node lost",
                         f"machine {nid} is up in LocalCompute, unknown to the control plane")

    def check_drain_cause(self, n: Node, faulty: set[str], now: float) -> None:
        """A node taken out of service had a fault the soak gave it (or one still present);
        and a drain an operator made is never undone."""
        w = self.watch.setdefault(n.node_id, NodeWatch())
        prev, w.last_state = w.last_state, n.state
        if n.in_service:
            if n.node_id in self.operator_drained:
                self.check("operator drains are kept")
                self.violate(("undrained", n.node_id), "operator drains are kept",
                             f"{n.node_id} back in service ({n.state.value}) after an "
                             "operator drain")
            w.last_in_service_since = n.since
            return
        if n.state not in OUT_OF_SERVICE or prev is None or prev not in (
                NodeState.IDLE, NodeState.ALLOCATED, NodeState.SUSPECT):
            return
        self.check("no drain without a fault")
        if n.node_id in faulty or w.last_fault_at >= w.last_in_service_since - CAUSE_SLACK_S \
                or n.node_id in self.operator_drained or n.retire_when_drained:
            return
        stale = (f"; a stale report or replayed report named it {now - w.last_stale_at:.0f} s "
                 "ago" if now - w.last_stale_at < STALE_WATCH_S else "")
        self.violate(("drain-cause", n.node_id, n.since), "no drain without a fault",
                     f"{n.node_id} went {prev.value} -> {n.state.value} (reason {n.reason!r}, "
                     f"diagnosis {n.last_diagnosis!r}) with no fault injected since it "
                     f"returned to service{stale}")

    def check_placement(self, nodes: dict[str, list[Node]], jobs: dict[str, Job],
                        faults: list[sqlite3.Row], workers: list[sqlite3.Row],
                        procs: dict[int, list[ProcInfo]], now: float) -> None:
        """No job starts on, or stays on, a node with an active fault that takes it out."""
        by_id = {n.node_id: n for members in nodes.values() for n in members}
        first_fault: dict[str, float] = {}
        for f in faults:
            if f["needs"] in TAKES_NODE_OUT:
                first_fault[f["node_id"]] = min(first_fault.get(f["node_id"], math.inf),
                                                f["injected_at"])
        for w in workers:
            t_f = first_fault.get(w["node_id"])
            if t_f is None:
                continue
            alive = w["exit_code"] is None and bool(procs.get(w["pid"]))
            self.check("no job on a node with a critical fault")
            node = by_id.get(w["node_id"])
            key = (w["job_id"], w["attempt"], w["rank"])
            if node is not None and node.state is NodeState.SUSPECT:
                # the blast-radius guard keeps it in service (policy): counted, not a fault
                self.held_work.add(key)
            if key in self.held_work:
                continue
            if w["started_at"] > t_f and \
                    self.elapsed(t_f, w["started_at"], blind=True) > PLACEMENT_SLACK_S:
                self.violate(("placed", w["job_id"], w["attempt"], w["rank"]),
                             "no job on a node with a critical fault",
                             f"{w['job_id']} attempt {w['attempt']} rank {w['rank']} started on "
                             f"{w['node_id']} {w['started_at'] - t_f:.1f} s after a fault that "
                             "takes it out of service")
            if alive and self.elapsed(t_f, now) > EVICT_BOUND_S:
                self.violate(("stays", w["job_id"], w["attempt"], w["rank"]),
                             "no job on a node with a critical fault",
                             f"{w['job_id']} attempt {w['attempt']} rank {w['rank']} still runs "
                             f"on {w['node_id']} ({node.state.value if node else '?'}) "
                             f"{now - t_f:.0f} s after a fault that takes it out of service")

    def check_gangs(self, jobs: dict[str, Job], workers: list[sqlite3.Row],
                    procs: dict[int, list[ProcInfo]], now: float,
                    parked: dict[tuple[int, int], float] | None = None) -> None:
        """One rank dead ends its gang; an ended attempt leaves no process behind. A process
        held for an in-process restart (its exit recorded as 75, its row in ``parked``) may
        outlive its attempt until its park deadline; one a later attempt took is that
        attempt's rank."""
        parked = parked or {}
        by: dict[tuple[str, int], list[sqlite3.Row]] = {}
        taken: dict[tuple[str, int, int], int] = {}  # (job, pid, start ticks) -> newest attempt
        for w in workers:
            by.setdefault((w["job_id"], w["attempt"]), []).append(w)
            key3 = (w["job_id"], w["pid"], w["start_ticks"])
            taken[key3] = max(taken.get(key3, 0), w["attempt"])
        for (job_id, attempt), ranks in by.items():
            job = jobs.get(job_id)
            running = [r for r in ranks if procs.get(r["pid"])]
            handed_on = [r for r in running if r["exit_code"] is not None and (
                taken[(job_id, r["pid"], r["start_ticks"])] > attempt
                or (r["pid"], r["start_ticks"]) in parked)]
            alive = [r for r in running if r not in handed_on]
            for r in handed_on:  # a held process no attempt took goes by its deadline
                deadline = parked.get((r["pid"], r["start_ticks"]))
                self.check("no orphaned worker process")
                if deadline is not None and now > deadline + ORPHAN_BOUND_S:
                    self.violate(("parked", job_id, attempt, r["rank"]),
                                 "no orphaned worker process",
                                 f"{job_id} attempt {attempt} rank {r['rank']}: held process "
                                 f"{r['pid']} still runs {now - deadline:.0f} s past its park "
                                 "deadline")
            dead = [r for r in ranks if r["exit_code"] not in (None, 0)
                    and r["exited_at"] is not None]
            self.check("a gang ends when one rank dies")
            if dead and alive:
                first = min(r["exited_at"] for r in dead)
                if self.elapsed(first, now) > GANG_END_BOUND_S:
                    self.violate(("gang", job_id, attempt), "a gang ends when one rank dies",
                                 f"{job_id} attempt {attempt}: rank(s) "
                                 f"{[r['rank'] for r in dead]} exited "
                                 f"{[r['exit_code'] for r in dead]} {now - first:.0f} s ago, "
                                 f"rank(s) {[r['rank'] for r in alive]} still run")
            over = job is None or job.terminal or attempt < job.attempt
            for r in alive:
                key = (job_id, attempt, r["rank"])
                if not over:
                    self.orphan_seen.pop(key, None)
                    continue
                seen = self.orphan_seen.setdefault(key, now)
                self.check("no orphaned worker process")
                if self.elapsed(seen, now) > ORPHAN_BOUND_S:
                    pids = [f"{p.pid}({p.state})" for p in procs.get(r["pid"], [])]
                    self.violate(("orphan", *key), "no orphaned worker process",
                                 f"{job_id} attempt {attempt} rank {r['rank']} "
                                 f"(job {job.state.value if job else 'gone'}, current attempt "
                                 f"{job.attempt if job else '-'}) still has processes "
                                 f"{pids} {now - seen:.0f}+ s after it ended")

    def doc_counts(self) -> dict[str, Any]:
        conn = sqlite3.connect(self.state_dir / "mtc.db", timeout=30.0)
        try:
            rows = conn.execute("SELECT collection, count(*) FROM docs GROUP BY collection"
                                ).fetchall()
            out: dict[str, Any] = {c: {"count": n, "oldest": None} for c, n in rows}
            for c in ("events", "processed_events"):
                row = conn.execute("SELECT id, json_extract(data, '$.time') FROM docs WHERE"
                                   " collection = ? ORDER BY json_extract(data, '$.time')"
                                   " LIMIT 1", (c,)).fetchone()
                if row is not None and c in out:
                    out[c]["oldest"] = (row[0], float(row[1]))
        finally:
            conn.close()
        return out

    def check_retention(self, now: float) -> None:
        """The event log and the idempotency records are pruned: nothing stays past its
        retention (+ the prune interval and slack). A document written late with an old
        time (a replayed envelope) is only over the bound if it is still there a prune
        interval later."""
        counts = self.doc_counts()
        self.fig.doc_samples.append({"t_s": round(self.rel(now), 1),
                                     **{c: v["count"] for c, v in counts.items()}})
        bound = SETTINGS["retention_s"] + SETTINGS["prune_interval_s"] + RETENTION_SLACK_S
        for collection in ("events", "processed_events"):
            entry = counts.get(collection)
            self.check("state within retention")
            if entry is None or entry["oldest"] is None:
                continue
            doc_id, t = entry["oldest"]
            age = now - t
            if age <= bound:
                self.over_bound.pop(collection, None)
                continue
            first_id, first_seen = self.over_bound.setdefault(collection, (doc_id, now))
            if first_id != doc_id:
                self.over_bound[collection] = (doc_id, now)
            elif now - first_seen > SETTINGS["prune_interval_s"] + RETENTION_SLACK_S:
                self.violate(("retention", collection, doc_id), "state within retention",
                             f"{collection}: document {doc_id[:12]} is {age:.0f} s old and "
                             f"unpruned for {now - first_seen:.0f} s, bound {bound:.0f} s "
                             f"(retention {SETTINGS['retention_s']:.0f} s + prune interval + "
                             f"slack); {entry['count']} documents")

    def all_settled(self) -> bool:
        nodes, jobs = self.read_state()
        if not all(p.submitted and p.job_id in jobs and jobs[p.job_id].terminal
                   for p in self.jobs.values()):
            return False
        return all(n.state not in TRANSIENT for members in nodes.values() for n in members)

    def final_checks(self) -> None:
        nodes, jobs = self.read_state()
        self.job_restarts = sum(j.restart_count for j in jobs.values())
        now = self.now()
        room = self.room(nodes, jobs, now)
        for p in self.jobs.values():
            job = jobs.get(p.job_id)
            if job is None or job.terminal:
                continue
            self.check("job makes progress")
            quiet = now - p.changed_at
            waiting = job.state in (JobState.QUEUED, JobState.PENDING)
            has_room, why = room.get(job.job_id, (True, ""))
            had_room = has_room and p.capacity_since is not None \
                and now - p.capacity_since > FINAL_QUIET_S
            # a running job silent no longer than the hung-job watchdog allows it (its limit,
            # then the grace to checkpoint and leave) is still the system's to catch
            watched = progress.limit(job, SETTINGS.get("progress_timeout_s", PROGRESS_TIMEOUT_S),
                                     ControlPlaneConfig().progress_interval_factor) or 0.0
            allowed = FINAL_QUIET_S + watched + SETTINGS["grace_period_s"]
            if (waiting and had_room) or (not waiting and quiet > allowed):
                self.violate(("unfinished", p.job_id), "job makes progress",
                             f"{p.job_id} ({p.replicas}x{p.steps} steps) still "
                             f"{job.state.value} (attempt {job.attempt}) {self.settle_s:.0f} s "
                             f"after the chaos ended, no change for {quiet:.0f} s "
                             f"({why or 'running'}){self.hang_note(p.job_id)}")
            else:
                p.final = f"{job.state.value} (at the end: " + (
                    "capacity only just back)" if waiting else "still progressing)")
        for members in nodes.values():
            for n in members:
                self.check("no node stuck")
                if n.state in TRANSIENT and now - n.since > FINAL_QUIET_S:
                    self.violate(("unsettled", n.node_id), "no node stuck",
                                 f"{n.node_id} still {n.state.value} (since "
                                 f"{self.rel(n.since):.0f} s, repair {n.repair_action}) "
                                 f"{self.settle_s:.0f} s after the chaos ended")

    # ------------------------------------------------------------------ reporting

    def progress(self) -> None:
        try:
            nodes, jobs = self.read_state()
        except sqlite3.OperationalError:
            return
        js = Counter(j.state.value.removeprefix("JOB_STATE_") for j in jobs.values())
        ns = Counter(n.state.value for m in nodes.values() for n in m if n.role is NodeRole.WORKER)
        docs = self.fig.doc_samples[-1] if self.fig.doc_samples else {}
        self.say(f"jobs {dict(sorted(js.items()))} | nodes {dict(sorted(ns.items()))} | "
                 f"faults {sum(v for k, v in self.fig.faults.items() if not k.startswith('on '))}"
                 f" kills {sum(self.fig.kills.values())} ctl-restarts "
                 f"{self.fig.controller_restarts} replays {sum(self.fig.replays.values())} | "
                 f"events {docs.get('events', 0)} processed {docs.get('processed_events', 0)} "
                 f"outbox {docs.get('outbox', 0)} | violations {len(self.violations)}")

    def figures(self) -> dict[str, Any]:
        finals = Counter(p.final or ("not submitted" if not p.submitted else "unfinished")
                         for p in self.jobs.values())
        samples = self.fig.doc_samples
        peak = {c: max((s.get(c, 0) for s in samples), default=0)
                for c in ("events", "processed_events", "outbox")}
        return {
            "seed": self.seed, "minutes": self.duration_s / 60, "jobs": self.n_jobs,
            "nodes": self.n_nodes, "aux_nodes": AUX_CLUSTER_NODES, "cpus": os.cpu_count(),
            "settled": self.settled,
            "jobs_by_final_state": dict(sorted(finals.items())),
            "jobs_cancelled_by_soak": sum(p.cancelled for p in self.jobs.values()),
            "job_restarts": self.job_restarts,
            "ranks_on_guard_held_nodes": len(self.held_work),
            "faults_by_kind": dict(sorted(self.fig.faults.items())),
            "kills_by_kind": dict(sorted(self.fig.kills.items())),
            "replays_by_kind": dict(sorted(self.fig.replays.items())),
            "chaos_actions": dict(sorted(self.fig.chaos.items())),
            **self.teeth.figures(),
            "controller_restarts": self.fig.controller_restarts,
            "guard_hold_sightings": self.fig.guard_holds,
            "invariant_checks": self.fig.checks,
            "checks_by_invariant": dict(sorted(self.fig.checks_by_invariant.items())),
            "docs_peak": peak,
            "docs_final": samples[-1] if samples else {},
            "violations": len(self.violations),
            "violation_details": [v.to_dict() for v in self.violations],
        }

    def report(self) -> None:
        figs = self.figures()
        self.last_figures = figs
        if not self.quiet:
            rows: list[tuple[str, str]] = []
            for key in ("jobs_by_final_state", "faults_by_kind", "kills_by_kind",
                        "replays_by_kind", "chaos_actions", "storage_and_client_chaos",
                        "api_answers_under_chaos", "checks_by_invariant", "docs_peak"):
                for k, v in figs[key].items():
                    rows.append((f"{key.replace('_', ' ')}: {k}", str(v)))
            for key in ("job_restarts", "controller_restarts", "guard_hold_sightings",
                        "invariant_checks", "settled", "violations"):
                rows.append((key.replace("_", " "), str(figs[key])))
            width = max(len(r[0]) for r in rows)
            print("\n" + "-" * (width + 12))
            for k, v in rows:
                print(f"{k:<{width}}  {v:>8}")
            print("-" * (width + 12))
            for v in self.violations:
                print(f"VIOLATION at {v.at:.1f}s [{v.invariant}] {v.detail}")
            print(json.dumps(figs, indent=2))

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        """Everything started is stopped: the controller, every worker (hung ones too)."""
        with contextlib.suppress(Exception):
            self.stop_controller()
        if self.app is not None:
            with contextlib.suppress(Exception):
                self.app.compute.kill_all()
            pids: list[int] = []
            with contextlib.suppress(Exception), self.compute_db() as db:
                pids = [r["pid"] for r in db.execute("SELECT pid FROM workers")]
            procs = proc_table()
            for pid in pids:
                if procs.get(pid):  # a group still running: orphaned or hung ranks
                    for sig in (signal.SIGCONT, signal.SIGKILL):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(pid, sig)
            with contextlib.suppress(Exception):
                self.app.close()
        for log in self.controller_logs:
            log.close()
        if self.teeth.mounted:  # the logs outlive the tmpfs
            keep = self.state_dir.parent / f"{self.state_dir.name}-logs"
            keep.mkdir(exist_ok=True)
            for f in self.state_dir.glob("controller-*.log"):
                shutil.copy2(f, keep / f.name)
            with contextlib.suppress(OSError):
                shutil.copytree(self.state_dir / "jobs", keep / "jobs", dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.pt", "*.ckpt"))
        self.teeth.unmount()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=10.0, help="chaos duration")
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--nodes", type=int, default=16, help="worker nodes of the main cluster")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--state-dir", type=Path, default=None,
                   help="wiped first (default: a temporary directory, removed after)")
    p.add_argument("--settle", type=float, default=SETTLE_S, help="seconds after the chaos")
    p.add_argument("--stuck-job", type=float, default=STUCK_JOB_S)
    p.add_argument("--stuck-node", type=float, default=STUCK_NODE_S)
    p.add_argument("--json-out", type=Path, default=None, help="also write the figures here")
    p.add_argument("--jobs-off-small-disk", action="store_true",
                   help="keep the jobs' checkpoints, logs and exit files off the tmpfs "
                        "disk_full fills (by default they share it)")
    args = p.parse_args(argv)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    tmp = None
    state_dir = args.state_dir
    if state_dir is None:
        tmp = tempfile.mkdtemp(prefix="mtc-soak-")
        state_dir = Path(tmp) / "state"
    soak = Soak(minutes=args.minutes, jobs=args.jobs, nodes=args.nodes, seed=args.seed,
                state_dir=state_dir, settle_s=args.settle, stuck_job_s=args.stuck_job,
                stuck_node_s=args.stuck_node, jobs_on_small_disk=not args.jobs_off_small_disk)
    try:
        code = soak.run()
        if args.json_out:
            args.json_out.write_text(json.dumps(soak.last_figures, indent=2))
        return code
    except KeyboardInterrupt:
        print("interrupted: everything started was stopped", file=sys.stderr)
        return 130
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
