"""Compute for the embedded default: simulated nodes, real worker processes.

Nodes are records on this machine (``nodes.LocalNodes``): provisioning and repairs complete
after set durations, faults are injected by hand (``mtc node fault``) and stay until a repair
that truly fixes them (``faults``: the triage table's action). Job workers are real
subprocesses (``procs``), started in their own session through ``worker_launcher`` so they
outlive the CLI process that started them; their exit is read back later from exit files.

All state lives in a sqlite file under ``state_dir`` (never only in memory), because several
short-lived CLI processes take turns driving the same workers and repairs. Results come back
as events from ``poll()``: each fact (a worker attempt exited, a checkpoint appeared, a repair
finished, a heartbeat slot) is claimed in the shared ledger in the same ``BEGIN IMMEDIATE``
transaction that queues its event in the fact outbox; the outbox is emitted after commit (so
an ``emit`` that calls back into this object does not deadlock) and a row is deleted once
``emit`` returns. A fact is therefore emitted once however many processes poll in turn; an
``emit`` that raises leaves its event for the next poll.

What a worker gets and how it answers (environment, exit codes, checkpoints) is the worker
protocol (``protocol``). Signals: ``signal_workers`` sends SIGTERM to each rank's launcher,
which relays it once to the rank's whole process group; after ``grace_s`` a ``poll()``
SIGKILLs the groups left.

Checkpoint tiers (``protocol.tier_env``): each simulated node has a directory,
``<state_dir>/nodes/<node>/``, whose ``shm/`` stands in for the node's ``/dev/shm``: a rank's
tier-1 entries are in ``shm/<job>/rank-<r>`` of its node, the tier-2 copy of rank ``r`` in
``shm/<job>/peer/rank-<r>`` of its buddy's node (rank ``(r + 1) % world``). A node's memory
goes with it: deleting it, or a repair that reboots, reimages or replaces it, wipes its
``shm/`` (the tier-1 entries of its ranks and the peer copies it held for others). Tier
saves are reported from the ranks' heartbeats (``tier_reports``).

Gangs: an attempt's ranks live and die together. When ``poll()`` finds a rank that exited
non-zero or was killed while the attempt had not been signalled, it records that rank as the
attempt's first failure and ends the rest as ``signal_workers`` would (SIGTERM to each
group, SIGKILL after ``gang_grace_s``); the attempt's one ``JobWorkersExited`` carries the
first failing rank's code. A rank's leftovers (processes of its group still running once its
launcher is gone) are SIGKILLed, and a killed launcher takes its command with it
(``worker_launcher``: PR_SET_PDEATHSIG), so nothing trains on unobserved.

Warm processes (``warm``, the ``WarmProcesses`` port): a rank whose program restarts in
process is held instead of SIGTERMed, and a rank of an in-place, hot-swap or scale-down
attempt goes on in a held process or its node's standby where one runs, else is launched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.adapters.compute.attempt_scan import AttemptScan
from shared.adapters.compute.disk_evidence import space
from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.job_env import host_env
from shared.adapters.compute.ledger import (
    SqliteLedger,
    all_ranks_exited,
    attempt_row,
    ranks_exited,
)
from shared.adapters.compute.local import queries, sandbox
from shared.adapters.compute.local.checks import CHECKS_SCHEMA, LocalChecks
from shared.adapters.compute.local.credentials import Issue, JobCredentials
from shared.adapters.compute.local.nodes import (
    DEFAULT_REPAIR_DURATIONS_S,
    NODES_SCHEMA,
    LocalNodes,
    NodeSettings,
)
from shared.adapters.compute.local.procs import (
    end_group,
    exit_code,
    rank_running,
    reap,
    remove_rank_tmp,
    signal_rank,
    spawn_launcher,
    start_ticks,
)
from shared.adapters.compute.local.warm import PARK_S, WARM_SCHEMA, LocalWarm
from shared.adapters.compute.protocol import managed_env, safe_name, tier_env
from shared.adapters.compute.worker_logs import LogFile
from shared.domain.health import Condition, RepairAction
from shared.domain.model import Node
from shared.domain.storage import StorageFloor
from shared.policies.preflight import PreflightPlan, PreflightResult
from shared.ports import Clock, Emitter, Gang, RankProcess, RecoveryPlan, WorkerSpec

MEMORY_LOST_BY = frozenset({RepairAction.REBOOT, RepairAction.REIMAGE, RepairAction.REPLACE})


@dataclass(frozen=True)
class WorkerStatus:
    """One rank of one attempt, as recorded (for `mtc job describe` and `mtc logs`)."""

    job_id: str
    attempt: int
    rank: int
    node_id: str
    pid: int
    log_path: str
    exit_code: int | None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, world_size INTEGER NOT NULL,
    checkpoint_dir TEXT NOT NULL, started_at REAL NOT NULL, signalled_at REAL,
    kill_deadline REAL, killed INTEGER NOT NULL DEFAULT 0,
    finalized INTEGER NOT NULL DEFAULT 0, failed_rank INTEGER, PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS workers (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    node_id TEXT NOT NULL, pid INTEGER NOT NULL, start_ticks INTEGER NOT NULL,
    exit_file TEXT NOT NULL, log_path TEXT NOT NULL, started_at REAL NOT NULL,
    exit_code INTEGER, exited_at REAL, PRIMARY KEY (job_id, attempt, rank));
"""


class LocalCompute:
    """The ``Compute`` port on one machine: simulated nodes (a held ``LocalNodes``),
    subprocess workers; with the ``DeepChecks`` capability (simulated), ``Preflight`` (a real
    gloo all-reduce) and ``ActiveChecks`` (``checks``); its ranks' warm processes are a held
    ``LocalWarm``."""

    DB_FILE = "compute.sqlite3"

    def __init__(
        self,
        state_dir: Path,
        emit: Emitter,
        clock: Clock,
        *,
        repair_durations_s: Mapping[RepairAction, float] | None = None,
        provision_duration_s: float = 0.0,
        python: str = sys.executable,
        agent_interval_s: float = 1.0,
        heartbeats: bool = True,
        gang_grace_s: float = 10.0,
        deep_check_duration_s: float = 2.0,
        active_check_duration_s: float = 1.0,
        park_s: float = PARK_S,
        in_process: bool = True,
        sandboxed: bool | None = False,
        run_as: str | None = None,
        output_root: Path | None = None,
        private_dirs: Sequence[Path] = (),
        storage_floor: StorageFloor | None = None,
        credentials: Issue | None = None,
    ) -> None:
        """``sandboxed`` (None: when root, as the embedded wiring asks): each rank as ``run_as``
        (default: a uid per job), ``private_dirs``, ``state_dir``, ``output_root`` hidden;
        ``storage_floor``: when a job's disk is full at a rank's exit (``disk_evidence``);
        ``credentials``: a job's own API credential (``credentials``), None: none."""
        self.state_dir = Path(state_dir)
        self._floor = storage_floor or StorageFloor()
        self._sandboxed = sandbox.enabled(sandboxed)
        self._run_as = run_as or os.environ.get("MTC_WORKER_USER") or None
        self._output_root = str(Path(output_root).absolute()) if output_root else None
        # a sandboxed rank sees the gs:// tree at /gcs/: its AIP_*_DIR are gs:// URIs, as
        # on Vertex; unsandboxed, /gcs/ is nobody's and they stay local paths
        self._gcs_root = os.path.join(self._output_root, "gcs") \
            if self._sandboxed and self._output_root else None
        self._private = [str(Path(p).absolute()) for p in (state_dir, *private_dirs)]
        self._clock = clock
        self._python = shutil.which(python) or python
        self._heartbeats = heartbeats
        self._gang_grace = gang_grace_s
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.credentials = JobCredentials(self.state_dir / "credentials", credentials, time.time)
        self._children: set[int] = set()  # launchers we spawned: ours to reap
        # in_process: offer in-process restarts (MTC_RESTART_FILE); park_s: how long a held
        # process waits for the next attempt
        self.warm = LocalWarm(self._python, self.state_dir, self._children, self._plan,
                              park_s=park_s, grace_s=gang_grace_s, offered=in_process,
                              gcs_root=self._gcs_root)
        schema = NODES_SCHEMA + CHECKS_SCHEMA + _SCHEMA + WARM_SCHEMA + sandbox.SCHEMA
        self.store = FactStore(self.state_dir / self.DB_FILE, schema, emit, clock)
        # checkpoints, heartbeats, ranks, and the ranks' processes (on this machine)
        self.scan = AttemptScan(self.store, queries.node_of, queries.rank_procs)
        self.nodes = LocalNodes(NodeSettings(
            repair_durations_s={**DEFAULT_REPAIR_DURATIONS_S, **(repair_durations_s or {})},
            provision_duration_s=provision_duration_s,
            agent_interval_s=agent_interval_s,
            deep_check_duration_s=deep_check_duration_s,
        ), self.store)
        self.checks = LocalChecks(self.store, self._python, active_check_duration_s)
        with self.store.tx() as db:
            queries.migrate(db)
            LocalWarm.migrate(db)

    # ------------------------------------------------------------ nodes (held)

    def provision_node(self, node: Node) -> None:
        self.nodes.provision_node(node)

    def cordon(self, node_id: str, reason: str) -> None:
        self.nodes.cordon(node_id, reason)

    def uncordon(self, node_id: str) -> None:
        self.nodes.uncordon(node_id)

    def delete_node(self, node_id: str) -> None:
        self.nodes.delete_node(node_id)
        self.wipe_node_memory(node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        if self.nodes.start_repair(node_id, action, attempt) and RepairAction(action) in MEMORY_LOST_BY:
            self.wipe_node_memory(node_id)  # the node goes down: its memory with it

    def node_dir(self, node_id: str) -> Path:
        """The simulated node's own directory (its ``shm/`` is its memory)."""
        return self.state_dir / "nodes" / safe_name(node_id)

    def memory_root(self, node_id: str) -> Path:
        """The node's stand-in for ``/dev/shm``: the checkpoint tiers' memory."""
        return self.node_dir(node_id) / "shm"

    def wipe_node_memory(self, node_id: str) -> None:
        """The node lost its memory (a reboot, a reimage, a replacement, the node lost): its
        ranks' tier-1 entries and the peer copies it held go."""
        shutil.rmtree(self.memory_root(node_id), ignore_errors=True)

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """The ``DeepChecks`` capability, simulated: see ``LocalNodes.start_deep_check``."""
        self.nodes.start_deep_check(node_id, attempt)

    def stage_software(self, node_id: str, version: Mapping[str, str]) -> None:
        self.nodes.stage_software(node_id, version)  # ``SoftwareImages``, simulated

    def inject_fault(self, node_id: str, conditions: Sequence[Condition]) -> None:
        self.nodes.inject_fault(node_id, conditions)

    def run_preflight(self, job_id: str, node_ids: Sequence[str], plan: PreflightPlan
                      ) -> PreflightResult:
        """The ``Preflight`` capability: a real gloo all-reduce (``checks.LocalChecks``)."""
        return self.checks.run_preflight(job_id, node_ids, plan)

    def start_active_check(self, node_id: str, key: str) -> None:
        """The ``ActiveChecks`` capability, simulated but for the real known-answer test."""
        self.checks.start_active_check(node_id, key)

    def cancel_active_check(self, node_id: str, key: str) -> None:
        self.checks.cancel_active_check(node_id, key)

    def node_faults(self, node_id: str) -> list[tuple[Condition, RepairAction]]:
        return self.nodes.node_faults(node_id)

    def storage_space(self, path: str) -> tuple[int, int] | None:
        """The ``StorageSpace`` capability: the file system of a job's files, here."""
        return space(path)

    def close(self) -> None:
        """Close the state file. Workers keep running: they outlive this object."""
        self.store.close()

    # ------------------------------------------------------------ workers

    def start_workers(self, gang: Gang) -> None:
        """Launch each (job, attempt, rank) once, a process per rank; a repeat is a no-op."""
        now = self._clock.now()
        launched: list[int] = []
        try:
            with self.store.tx() as db:
                self._start_new(db, gang, now, launched)
        except BaseException:
            for pid in launched:  # rolled back: nothing records them, so nothing may run
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            raise

    def _start_new(
        self, db: sqlite3.Connection, gang: Gang, now: float, launched: list[int]
    ) -> None:
        pools = tuple(g.count for g in gang.groups)
        before = queries.placement_before(db, gang.job_id, gang.attempt)
        plan = gang.recovery
        for spec in gang.workers():  # by rank
            key = (spec.job_id, spec.attempt, spec.rank)
            if db.execute(
                "SELECT 1 FROM workers WHERE job_id = ? AND attempt = ? AND rank = ?", key
            ).fetchone():
                continue
            self.store.ledger(db).start_attempt(spec.job_id, spec.attempt, spec.world_size,
                                           str(Path(spec.checkpoint_dir).absolute()), now)
            tiers = tier_env(spec.job_id, spec.rank, gang.node_ids, self.memory_root,
                             spec.checkpoint_dir, before)
            log = str(self.log_path(spec.job_id, spec.attempt, spec.rank))
            env = self.worker_env(spec, pools, tiers, plan)
            managed = managed_env(spec, pools=pools, tiers=tiers, recovery=plan,
                                  port_salt=str(self.state_dir), gcs_root=self._gcs_root)
            process = self.warm.take(db, spec, plan, managed, log) \
                or self._launch(db, spec, env, launched)
            self.warm.want(db, spec, env)  # a standby on its node, should its process die
            db.execute(
                "INSERT INTO workers (job_id, attempt, rank, node_id, pid, start_ticks,"
                " exit_file, log_path, started_at, control_file)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*key, spec.node_id, process.pid, process.start_ticks, process.exit_file, log,
                 now, process.control_file),
            )
        self.warm.settle(db, gang, now)

    def worker_env(self, spec: WorkerSpec, pools: Sequence[int] = (),
                   tiers: Mapping[str, str] | None = None,
                   recovery: RecoveryPlan | None = None) -> dict[str, str]:
        """The environment a managed service gives a replica: the host's allow-listed part
        of this process's (``job_env``: never the server's secrets), the spec's env and the
        service's own variables, which the spec cannot override; ``pools``: the gang's replicas per pool;
        ``tiers``: its checkpoint tier directories; ``recovery``: how the attempt was
        started (``MTC_RECOVERY_MODE``)."""
        env = {**host_env(), **managed_env(spec, pools=pools, tiers=tiers, recovery=recovery,
                                           port_salt=str(self.state_dir),
                                           gcs_root=self._gcs_root),
               **self.credentials.env(spec.job_id)}
        if "PATH" not in dict(spec.env):  # `python` in a command is mtc's own, with its packages
            env["PATH"] = os.pathsep.join([str(Path(self._python).parent),
                                           *filter(None, env.get("PATH", "").split(os.pathsep))])
        return env

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.state_dir / "logs" / safe_name(job_id) / f"attempt-{attempt}-rank-{rank}.log"

    def _launch(self, db: sqlite3.Connection, spec: WorkerSpec, env: Mapping[str, str],
                launched: list[int]) -> RankProcess:
        """Start the rank's launcher in a new session: it survives us and records the exit
        code in its exit file."""
        for d in (spec.checkpoint_dir, spec.model_dir, spec.tensorboard_dir):
            Path(d).mkdir(parents=True, exist_ok=True)
        log = self.log_path(spec.job_id, spec.attempt, spec.rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        run_dir = self.state_dir / "run" / safe_name(spec.job_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        exit_file = run_dir / f"attempt-{spec.attempt}-rank-{spec.rank}.exit"
        exit_file.unlink(missing_ok=True)
        control, offer = self.warm.prepare(exit_file)
        full = {**env, **offer}
        for where in sandbox.storage_mounts(full, self._output_root).values():
            Path(where).mkdir(parents=True, exist_ok=True)
        plan = self._plan(db, spec, full, exit_file, control, log)
        if plan is not None:  # in its sandbox each mount is at the path the job sees
            full.update(sandbox.seen_in_sandbox(full))
        pid = spawn_launcher(self._python, exit_file, spec.command, full, log, plan)
        launched.append(pid)
        self._children.add(pid)
        return RankProcess(pid, start_ticks(pid), str(exit_file), str(control))

    def _plan(self, db: sqlite3.Connection | None, spec: WorkerSpec, env: Mapping[str, str],
              exit_file: Path, control: Path, log: Path) -> Path | None:
        """The rank's (or a standby's) sandbox when sandboxed, else None: it keeps its control
        file's directory and its job's logs (where an in-process restart moves its output)
        and nothing else of the state directory."""
        if not self._sandboxed or db is None:
            return None
        return sandbox.plan_file(db, spec, env, exit_file, run_as=self._run_as,
                                 hidden=self._private, python=self._python,
                                 output_root=self._output_root,
                                 own_dirs=(str(control.parent), str(log.parent)),
                                 read_only=self.credentials.read_only(spec.job_id),
                                 mounts=sandbox.storage_mounts(env, self._output_root))

    def workers(self, job_id: str | None = None) -> list[WorkerStatus]:
        """What was started, with exit codes seen so far (updated by ``poll()``)."""
        with self.store.tx() as db:
            return [WorkerStatus(r["job_id"], r["attempt"], r["rank"], r["node_id"], r["pid"],
                                 r["log_path"], r["exit_code"]) for r in queries.workers(db, job_id)]

    def log_files(self, job_id: str) -> list[LogFile]:
        """Each rank's output of each attempt, one file apiece (``worker_logs``)."""
        with self.store.tx() as db:
            return queries.log_files(db, job_id)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        """SIGTERM every rank now, SIGKILL in ``poll()`` after ``grace_s``. A repeat does not
        signal again; it can only bring the deadline closer."""
        now = self._clock.now()
        with self.store.tx() as db:
            att = attempt_row(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            if SqliteLedger(db).signal(att, now, grace_s):
                self._stop_ranks(db, job_id, attempt)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        """SIGKILL every rank of the attempt now; harmless if they are gone."""
        now = self._clock.now()
        with self.store.tx() as db:
            att = attempt_row(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            self._kill_attempt(db, job_id, attempt, now)
            self.warm.end(db, job_id, now)

    def kill_all(self, wait_s: float = 2.0) -> None:
        """SIGKILL every live worker (tests, demo shutdown) and wait up to ``wait_s`` for
        them to go, so the next ``poll()`` reports them."""
        now = self._clock.now()
        with self.store.tx() as db:
            attempts = db.execute("SELECT * FROM attempts WHERE finalized = 0").fetchall()
            running = [w for a in attempts
                       for w in queries.live_ranks(db, a["job_id"], a["attempt"])]
            for att in attempts:
                self._kill_attempt(db, att["job_id"], att["attempt"], now)
            self.warm.end(db, None, now)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            reap(self._children)
            if not any(rank_running(w) for w in running):
                return
            time.sleep(0.01)

    def _kill_attempt(self, db: sqlite3.Connection, job_id: str, attempt: int, now: float) -> None:
        for w in queries.live_ranks(db, job_id, attempt):
            signal_rank(w, signal.SIGKILL)
        db.execute(
            "UPDATE attempts SET killed = 1, kill_deadline = COALESCE(MIN(kill_deadline, ?), ?)"
            " WHERE job_id = ? AND attempt = ?",
            (now, now, job_id, attempt),
        )

    def _observe_workers(self, db: sqlite3.Connection, now: float) -> None:
        for att in db.execute("SELECT * FROM attempts WHERE finalized = 0").fetchall():
            job_id, attempt = att["job_id"], att["attempt"]
            deadline = att["kill_deadline"]
            if deadline is not None and deadline <= now and not att["killed"]:
                self._kill_attempt(db, job_id, attempt, now)
            failed_rank = att["failed_rank"]
            newly_failed: list[int] = []
            parked = self.warm.park(db, job_id, attempt, now)  # out of the attempt, kept
            for w in queries.live_ranks(db, job_id, attempt):
                code = parked.get(w["rank"])
                if code is None:
                    code = exit_code(w)
                    if code is None:
                        continue
                    end_group(w)  # no orphans: what the rank left running goes with it
                db.execute(
                    "UPDATE workers SET exit_code = ?, exited_at = ?"
                    " WHERE job_id = ? AND attempt = ? AND rank = ?",
                    (code, now, job_id, attempt, w["rank"]),
                )
                if code != 0:
                    newly_failed.append(w["rank"])
            if newly_failed and failed_rank is None and att["signalled_at"] is None:
                failed_rank = newly_failed[0]
                db.execute(
                    "UPDATE attempts SET failed_rank = ? WHERE job_id = ? AND attempt = ?",
                    (failed_rank, job_id, attempt),
                )
                self._end_gang(db, att, now)
            ranks = db.execute("SELECT rank, exit_code, exit_file FROM workers WHERE job_id = ?"
                               " AND attempt = ? ORDER BY rank", (job_id, attempt)).fetchall()
            codes = {r["rank"]: r["exit_code"] for r in ranks}
            self.scan.scan(db, att, now, codes)
            if not all_ranks_exited(codes):
                continue
            self.scan.forget(job_id, attempt)
            for r in ranks:  # a launcher killed before it ended leaves its TMPDIR
                remove_rank_tmp(r["exit_file"])
            if all(c == 0 for c in codes.values()):
                self.warm.end(db, job_id, now)  # the job is done: its standbys with it
            note, full, launch = queries.exit_note(db, att, ranks, codes, failed_rank,
                                                   self._floor)
            self.store.queue(db, ranks_exited(self.store.ledger(db), job_id, attempt, codes,
                                              note, first_failed=failed_rank, storage_full=full,
                                              launch_failed=launch))

    def _end_gang(self, db: sqlite3.Connection, att: sqlite3.Row, now: float) -> None:
        """A rank failed: the attempt is over for every rank. SIGTERM the others' groups now;
        ``poll()`` SIGKILLs what is left after ``gang_grace_s``."""
        if SqliteLedger(db).signal(att, now, self._gang_grace):
            self._stop_ranks(db, att["job_id"], att["attempt"])

    def _stop_ranks(self, db: sqlite3.Connection, job_id: str, attempt: int) -> None:
        """SIGTERM each live rank, or hold it where its program restarts in process."""
        held = self.warm.hold(db, job_id, attempt)
        for w in queries.live_ranks(db, job_id, attempt):
            if w["rank"] not in held:
                signal_rank(w, signal.SIGTERM)

    def poll(self) -> None:
        """Turn what happened since the last poll (by any process) into events, once each."""
        now = self._clock.now()
        reap(self._children)
        with self.store.tx() as db:
            self.nodes.observe(db, now)
            self.checks.observe(db, now)
            self._observe_workers(db, now)
            self.credentials.refresh(db)
            self.warm.tick(db, now)
            if self._heartbeats:
                self.nodes.send_heartbeats(db, now)
        self.store.drain()

