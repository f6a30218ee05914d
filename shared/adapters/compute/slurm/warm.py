"""Warm processes on Slurm: the ``WarmProcesses`` port where the job's allocation outlives
its attempts (``SlurmSettings.warm``; the scripts: ``warm_scripts``, ``handover``).

The allocation. The attempt that asks Slurm for one (an ``sbatch``, as every attempt does
without warm processes) is its *host*; the job's next attempt reuses it when it is in place,
a hot swap or a scale down onto nodes the allocation holds, and the allocation is still
running: that attempt is one more step in it (``warm_scripts.order``), recorded under the
same Slurm job id. Any other attempt (a requeue, a node the allocation lacks: a hot swap's
spare) releases it (``release`` and ``scancel``, its held processes with it) and asks for its
own. Every attempt stays an attempt of its own in the ledger: its events, its restart count
and its exit code, as without warm processes.

The ranks. Each rank's program is offered in-process restart (``MTC_RESTART_FILE``, a control
file per rank in the attempt's run directory: shared storage, as every run directory is).
Where a rank fails, or the attempt is signalled, and every live rank declared, each is sent a
``hold`` (``warm_orders``) instead of the step's SIGTERM; a rank that answered counts as
exited 75 for its attempt and is *parked* (``warm_parked``). Where one live rank did not
declare, none is held: Slurm signals a step's tasks together, so the attempt is signalled as
without warm processes. The next attempt gives each rank on a parked process's node that
process (``take``: ``rank-<r>.take`` names its control file and the exit file its launcher
writes); the rank's task computes its environment as for a new process and hands it over as
a ``restart`` order (``handover``). A parked process nobody takes is ended by a hold whose
deadline is now (the adapter cannot signal a process on a node; the program can read), or ends
by itself at its hold's deadline.

No standbys here (``want`` keeps none): a rank whose process died starts a new one.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path

from mtc_program import inprocess
from shared.adapters.compute import warm_orders
from shared.adapters.compute.protocol import ExitCode, read_exit_file
from shared.adapters.compute.slurm.api import TERMINAL_JOB_STATES
from shared.adapters.compute.slurm.view import SlurmView
from shared.ports import Gang, RankProcess, RecoveryPlan, WarmProcesses, WorkerSpec

WARM_SCHEMA = """
CREATE TABLE IF NOT EXISTS warm_allocs (
    job_id TEXT PRIMARY KEY, host_attempt INTEGER NOT NULL, alloc_dir TEXT NOT NULL,
    slurm_nodes TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS warm_ranks (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    node_id TEXT NOT NULL, control TEXT NOT NULL, launcher_exit TEXT NOT NULL,
    hold_gen INTEGER, PRIMARY KEY (job_id, attempt, rank));
CREATE TABLE IF NOT EXISTS warm_parked (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    node_id TEXT NOT NULL, control TEXT NOT NULL, launcher_exit TEXT NOT NULL,
    run_dir TEXT NOT NULL, deadline REAL NOT NULL, PRIMARY KEY (job_id, attempt, rank));
CREATE TABLE IF NOT EXISTS warm_failed (
    job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
    PRIMARY KEY (job_id, attempt));
"""

RunDir = Callable[[str, int], Path]


def control_path(run_dir: Path, rank: int) -> Path:
    """A rank's control file, as ``task.sh`` exports it (``warm_scripts.task_lines``)."""
    return run_dir / f"rank-{rank}.ctl" / "restart.json"


class SlurmWarm(WarmProcesses[sqlite3.Connection]):
    """Held ranks of a Slurm job's attempts, and the allocation that keeps them."""

    def __init__(self, view: SlurmView, run_dir: RunDir, *, park_s: float) -> None:
        self._view = view
        self._run_dir = run_dir
        self._park_s = park_s

    # -- the allocation

    def reusable(self, db: sqlite3.Connection, gang: Gang, slurm_nodes: Sequence[str]
                 ) -> tuple[int, Path] | None:
        """(Slurm job id, run directory of its host) of the job's allocation when ``gang``
        can run in it, else None."""
        plan = gang.recovery
        if plan is None or plan.mode not in warm_orders.IN_PROCESS_MODES:
            return None
        alloc = db.execute("SELECT * FROM warm_allocs WHERE job_id = ?", (gang.job_id,)
                           ).fetchone()
        if alloc is None or not set(slurm_nodes) <= set(json.loads(alloc["slurm_nodes"])):
            return None
        slurm_id = self._slurm_id(db, gang.job_id, alloc["host_attempt"])
        job = None if slurm_id is None else self._view.jobs.get(slurm_id)
        if job is None or job.job_state in TERMINAL_JOB_STATES or job.restart_cnt > 0:
            return None
        assert slurm_id is not None
        return slurm_id, Path(alloc["alloc_dir"])

    def host(self, db: sqlite3.Connection, gang: Gang, run_dir: Path,
             slurm_nodes: Sequence[str]) -> int | None:
        """``gang``'s attempt asks Slurm for an allocation of its own: the attempt that hosted
        the job's previous one, whose allocation is released (the caller cancels it), or None."""
        old = db.execute("SELECT * FROM warm_allocs WHERE job_id = ?", (gang.job_id,)).fetchone()
        if old is not None:
            (Path(old["alloc_dir"]) / "release").touch()
        db.execute("INSERT OR REPLACE INTO warm_allocs (job_id, host_attempt, alloc_dir,"
                   " slurm_nodes) VALUES (?, ?, ?, ?)",
                   (gang.job_id, gang.attempt, str(run_dir), json.dumps(list(slurm_nodes))))
        self._record(db, gang)
        return None if old is None else int(old["host_attempt"])

    def release(self, db: sqlite3.Connection, job_id: str) -> None:
        """The job is done: its allocation goes now, not after ``IDLE_S``."""
        alloc = db.execute("SELECT alloc_dir FROM warm_allocs WHERE job_id = ?", (job_id,)
                           ).fetchone()
        if alloc is not None:
            (Path(alloc["alloc_dir"]) / "release").touch()
            db.execute("DELETE FROM warm_allocs WHERE job_id = ?", (job_id,))

    def takes(self, db: sqlite3.Connection, gang: Gang) -> list[int]:
        """``gang`` runs in the job's allocation: each rank takes a parked process on its
        node where one is (``take``); the ranks that did. Parked processes not taken end."""
        taken = []
        for spec in gang.workers():
            if self.take(db, spec, gang.recovery, {}, "") is not None:
                taken.append(spec.rank)
        self._record(db, gang)
        self.settle(db, gang, time.time())
        return taken

    def _record(self, db: sqlite3.Connection, gang: Gang) -> None:
        """The control and exit file of each rank not given a parked process: its own."""
        run_dir = self._run_dir(gang.job_id, gang.attempt)
        for rank, node in enumerate(gang.node_ids):
            db.execute("INSERT OR IGNORE INTO warm_ranks (job_id, attempt, rank, node_id,"
                       " control, launcher_exit) VALUES (?, ?, ?, ?, ?, ?)",
                       (gang.job_id, gang.attempt, rank, node,
                        str(control_path(run_dir, rank)), str(run_dir / f"rank-{rank}.exit")))

    @staticmethod
    def _slurm_id(db: sqlite3.Connection, job_id: str, attempt: int) -> int | None:
        row = db.execute("SELECT slurm_job_id FROM attempts WHERE job_id = ? AND attempt = ?",
                         (job_id, attempt)).fetchone()
        return None if row is None or row["slurm_job_id"] is None else int(row["slurm_job_id"])

    # -- a gang's end

    def fail(self, db: sqlite3.Connection, job_id: str, attempt: int, rank: int) -> None:
        """``rank``'s failure ended the attempt (the others are then held, not killed)."""
        db.execute("INSERT OR IGNORE INTO warm_failed (job_id, attempt, rank) VALUES (?, ?, ?)",
                   (job_id, attempt, rank))

    @staticmethod
    def failed_rank(db: sqlite3.Connection, job_id: str, attempt: int) -> int | None:
        row = db.execute("SELECT rank FROM warm_failed WHERE job_id = ? AND attempt = ?",
                         (job_id, attempt)).fetchone()
        return None if row is None else int(row["rank"])

    def _live(self, db: sqlite3.Connection, job_id: str, attempt: int) -> list[sqlite3.Row]:
        run_dir = self._run_dir(job_id, attempt)
        return [r for r in db.execute("SELECT * FROM warm_ranks WHERE job_id = ? AND"
                                      " attempt = ? ORDER BY rank", (job_id, attempt))
                if read_exit_file(run_dir / f"rank-{r['rank']}.exit") is None]

    # -- the port

    def take(self, tx: sqlite3.Connection, spec: WorkerSpec, plan: RecoveryPlan | None,
             env: Mapping[str, str], log: str) -> RankProcess | None:
        """The job's parked process on the rank's node, given to the rank's task
        (``rank-<r>.take``: the task writes the ``restart`` order with the environment it
        computes, so ``env`` and ``log`` are not used here). The scripts must be written."""
        if plan is None or plan.mode not in warm_orders.IN_PROCESS_MODES \
                or spec.node_id in plan.fresh_node_ids:
            return None
        rows = tx.execute("SELECT * FROM warm_parked WHERE job_id = ? AND node_id = ?"
                          " ORDER BY attempt DESC, rank", (spec.job_id, spec.node_id)).fetchall()
        run_dir = self._run_dir(spec.job_id, spec.attempt)
        for row in rows:
            tx.execute("DELETE FROM warm_parked WHERE job_id = ? AND attempt = ? AND rank = ?",
                       (row["job_id"], row["attempt"], row["rank"]))
            if read_exit_file(Path(row["launcher_exit"])) is not None:
                continue  # it ended while parked
            (run_dir / f"rank-{spec.rank}.oldpeer").write_text(
                str(Path(row["run_dir"]) / f"peer-store-{row['rank']}.pid"))
            take = {"control": row["control"], "exit_file": row["launcher_exit"]}
            (run_dir / f"rank-{spec.rank}.take").write_text(json.dumps(take))
            tx.execute("INSERT OR REPLACE INTO warm_ranks (job_id, attempt, rank, node_id,"
                       " control, launcher_exit) VALUES (?, ?, ?, ?, ?, ?)",
                       (spec.job_id, spec.attempt, spec.rank, spec.node_id, row["control"],
                        row["launcher_exit"]))
            pid = inprocess.read_state(Path(row["control"])).get("pid", 0)
            return RankProcess(pid, 0, row["launcher_exit"], row["control"])
        return None

    def want(self, tx: sqlite3.Connection, spec: WorkerSpec, env: Mapping[str, str]) -> None:
        """No standbys on Slurm: a rank whose process died starts a new one."""

    def settle(self, tx: sqlite3.Connection, gang: Gang, now: float) -> None:
        self.end(tx, gang.job_id, now)

    def hold(self, tx: sqlite3.Connection, job_id: str, attempt: int) -> Set[int]:
        """Hold every live rank of the attempt if each declared, else none (Slurm signals
        the step's tasks together: the caller signals the attempt)."""
        live = self._live(tx, job_id, attempt)
        if not all(r["hold_gen"] is not None or warm_orders.declared(Path(r["control"]))
                   for r in live):
            return frozenset()
        deadline = warm_orders.hold_deadline(self._park_s)
        for r in live:
            if r["hold_gen"] is None:
                gen = warm_orders.write_hold(Path(r["control"]), deadline)
                tx.execute("UPDATE warm_ranks SET hold_gen = ? WHERE job_id = ? AND attempt = ?"
                           " AND rank = ?", (gen, job_id, attempt, r["rank"]))
        return {r["rank"] for r in live}

    def park(self, tx: sqlite3.Connection, job_id: str, attempt: int, now: float
             ) -> dict[int, int]:
        run_dir = self._run_dir(job_id, attempt)
        out: dict[int, int] = {}
        for r in self._live(tx, job_id, attempt):
            if r["hold_gen"] is None or not warm_orders.held_since(Path(r["control"]),
                                                                   r["hold_gen"]):
                continue
            tx.execute("INSERT OR IGNORE INTO warm_parked (job_id, attempt, rank, node_id,"
                       " control, launcher_exit, run_dir, deadline) VALUES (?, ?, ?, ?, ?, ?,"
                       " ?, ?)", (job_id, attempt, r["rank"], r["node_id"], r["control"],
                                  r["launcher_exit"], str(run_dir), now + self._park_s))
            out[r["rank"]] = int(ExitCode.PREEMPTED)
        return out

    def end(self, tx: sqlite3.Connection, job_id: str | None, now: float) -> None:
        """A hold whose deadline is now: the program exits as on SIGTERM."""
        rows = tx.execute("SELECT * FROM warm_parked WHERE ? IS NULL OR job_id = ?",
                          (job_id, job_id)).fetchall()
        for row in rows:
            warm_orders.write_hold(Path(row["control"]), time.time())
        tx.execute("DELETE FROM warm_parked WHERE ? IS NULL OR job_id = ?", (job_id, job_id))

    def tick(self, tx: sqlite3.Connection, now: float) -> None:
        """A parked process not taken in time has ended by its own hold's deadline."""
        tx.execute("DELETE FROM warm_parked WHERE deadline <= ?", (now,))
