"""Chaos soak: many jobs, random faults and kills, invariants checked all along.

    python bench/soak.py [--minutes M] [--jobs N] [--nodes K] [--seed S] [--state-dir DIR]

One cluster of K worker nodes (plus a small second cluster, so that "a node owned by two
clusters" can be seen) runs N jobs of ``examples/train.py`` (1, 2 or 4 replicas; mostly short,
some long) on the embedded default. The control loop runs in a child process
(``bench/soak_controller.py``) that the soak SIGKILLs and restarts at random.

:class:`Soak` is the runner: it sets the clusters up, submits and cancels the jobs, keeps the
controller running, draws a chaos action now and then from one seeded RNG and has its
collaborators act and check, each holding the runner: the chaos on the fleet and the control
plane (:mod:`bench.soak_chaos_fleet`), the storage and client chaos (:mod:`bench.soak_chaos`),
and the invariants on jobs and the store (:mod:`bench.soak_checks`) and on nodes and workers
(:mod:`bench.soak_node_checks`), checked every ``CHECK_EVERY_S`` against the control plane's
state *and* the ground truth (LocalCompute's sqlite file: injected faults, worker pids;
``/proc``). Each violation is recorded once, with the time and the detail. At the end: figures
as a table and as JSON; the exit status is 1 if any invariant was violated. Every constant is
in :mod:`bench.soak_settings`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.soak_chaos import TEETH_MUST_HAPPEN, TEETH_WEIGHTS, Teeth  # noqa: E402
from bench.soak_chaos_fleet import FleetChaos  # noqa: E402
from bench.soak_checks import JobChecks, StoreChecks  # noqa: E402
from bench.soak_control import ControllerChild  # noqa: E402
from bench.soak_controller import open_app  # noqa: E402
from bench.soak_node_checks import NodeChecks  # noqa: E402
from bench.soak_records import Figures, NodeWatch, PlannedJob, Violation, proc_table  # noqa: E402
from bench.soak_report import Report  # noqa: E402
from bench.soak_settings import (  # noqa: E402
    AUX,
    AUX_CLUSTER_NODES,
    AUX_JOB_FRACTION,
    CANCEL_FRACTION,
    CHAOS_COVERAGE_FROM,
    CHAOS_MEAN_INTERVAL_S,
    CHAOS_MUST_HAPPEN,
    CHAOS_WEIGHTS,
    CHECK_EVERY_S,
    LONG_JOB_FRACTION,
    LONG_STEPS,
    MAIN,
    PROGRESS_EVERY_S,
    REPLICA_CHOICES,
    RESTART_ANYWAY_FRACTION,
    SETTINGS,
    SETTLE_S,
    SHORT_STEPS,
    SPARE_NODES,
    STEP_TIME_S,
    STUCK_JOB_S,
    STUCK_NODE_S,
    SUBMIT_WINDOW_FRACTION,
    TRANSIENT,
    cluster_spec,
    job_spec,
)
from services.job_submission import commands as job_commands  # noqa: E402
from services.wiring.embedded import EmbeddedApp  # noqa: E402
from shared.domain.model import Job, Node, Partition  # noqa: E402

# ----------------------------------------------------------------------------- the soak


class Soak:
    """The runner: set-up, the jobs' plan, the loop that draws chaos and checks, the settle
    time, the final checks and the clean-up; its collaborators act, check and report."""

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
        # what the chaos did, which the checks read: per node (faults, stale reports), the
        # operator's drains, the SIGSTOPped ranks by job
        self.watch: dict[str, NodeWatch] = {}
        self.operator_drained: dict[str, float] = {}
        self.hung: dict[str, str] = {}  # job id -> what the soak SIGSTOPped
        self.job_restarts = 0
        self.partitions: dict[str, Partition] = {}
        self.expected_workers = {MAIN: nodes, AUX: AUX_CLUSTER_NODES}
        self.t0 = time.time()
        self.app: EmbeddedApp | None = None
        self.settled = False
        self.last_figures: dict[str, Any] = {}
        self.root = ROOT
        self.outages: list[tuple[float, float | None]] = []  # (start, end or None: ongoing)
        self.controller = ControllerChild(self)
        self.fleet_chaos = FleetChaos(self)
        # disk full, damaged state, stalled clients, a locked store
        self.teeth = Teeth(self, jobs_on_small_disk=jobs_on_small_disk)
        self.job_checks = JobChecks(self)
        self.node_checks = NodeChecks(self)
        self.store_checks = StoreChecks(self)
        self.reporter = Report(self)

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
                       for a, b in (self.outages + self.controller.outages if blind
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

    def reopen(self) -> None:
        """The soak's own handle on the state, opened again (after a restore)."""
        if self.app is not None:
            self.app.close()
        self.app = open_app(self.state_dir, SETTINGS)

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
        self.controller.start()
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
        self.reporter.report()
        return 1 if self.violations else 0

    def loop(self) -> None:
        end = self.t0 + self.duration_s
        next_chaos = self.now() + self.rng.expovariate(1 / CHAOS_MEAN_INTERVAL_S)
        next_check = self.now() + CHECK_EVERY_S
        next_progress = self.now() + PROGRESS_EVERY_S
        while self.now() < end:
            self.controller.keep()
            self.submit_and_cancel()
            if self.now() >= next_chaos:
                self.chaos(covering=self.now() >= self.t0 + CHAOS_COVERAGE_FROM * self.duration_s)
                next_chaos = self.now() + self.rng.expovariate(1 / CHAOS_MEAN_INTERVAL_S)
            if self.now() >= next_check:
                self.check_all()
                next_check = self.now() + CHECK_EVERY_S
            if self.now() >= next_progress:
                self.reporter.progress()
                next_progress = self.now() + PROGRESS_EVERY_S
            time.sleep(0.05)

    def settle(self) -> None:
        """No more chaos: every job must end and every node settle, checks still running."""
        self.controller.down_until = min(self.controller.down_until or 0, self.now())
        self.controller.keep()
        for planned in self.jobs.values():  # whatever was not submitted yet goes now
            planned.submit_at = min(planned.submit_at, self.rel())
        self.submit_and_cancel()
        self.say("chaos over: settling")
        deadline = self.now() + self.settle_s
        next_progress = self.now() + PROGRESS_EVERY_S
        while self.now() < deadline:
            self.controller.keep()
            self.check_all()
            for node_id in list(self.operator_drained):  # the operator's maintenance ends
                self.fleet_chaos.operator_resume(node_id)
            if self.all_settled():
                self.settled = True
                break
            if self.now() >= next_progress:
                self.reporter.progress()
                next_progress = self.now() + PROGRESS_EVERY_S
            time.sleep(1.0)
        self.reporter.progress()

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

    # ------------------------------------------------------------------ chaos and checks

    def chaos(self, covering: bool = False) -> None:
        weights = {**CHAOS_WEIGHTS, **{k: TEETH_WEIGHTS[k] for k in self.teeth.kinds()}}
        kinds = list(weights)
        kind = self.rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
        must = [*CHAOS_MUST_HAPPEN, *(k for k in TEETH_MUST_HAPPEN if k in weights)]
        missing = [k for k in must if not self.fig.chaos[k]]
        if covering and missing and kind not in missing:
            kind = missing[0]
        acts = self.fleet_chaos if hasattr(self.fleet_chaos, f"chaos_{kind}") else self.teeth
        done = getattr(acts, f"chaos_{kind}")()
        if done:
            self.fig.chaos[kind] += 1

    def read_state(self) -> tuple[dict[str, list[Node]], dict[str, Job]]:
        with self.a.transaction() as uow:
            nodes = {c: list(uow.nodes.list(c)) for c in (MAIN, AUX)}
            jobs = {j.job_id: j for j in uow.jobs.list()}
            self.partitions = {p.key: p for c in (MAIN, AUX) for p in uow.partitions.list(c)}
        return nodes, jobs

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
        self.job_checks.check(nodes, jobs, now)
        self.node_checks.check(nodes, jobs, machines, faults, now)
        self.node_checks.check_placement(nodes, jobs, faults, workers, procs, now)
        self.node_checks.check_gangs(jobs, workers, procs, now, parked)
        self.store_checks.check(now)

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
        self.job_checks.final(nodes, jobs, now)
        self.node_checks.final(nodes, now)

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        """Everything started is stopped: the controller, every worker (hung ones too)."""
        with contextlib.suppress(Exception):
            self.controller.stop()
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
        self.controller.close_logs()
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
