"""The Slurm adapter's attempts: one batch job per (job, attempt), its signals and its end.

``start_workers`` submits one batch job per attempt (``sbatch --requeue --open-mode=append
--exclusive --nodelist=<mapped nodes>``, one ``srun`` task per node, placed by rank and
running its worker pool's command; scripts by ``scripts``). ``poll()`` reports each
new checkpoint once and the attempt's one ``JobWorkersExited`` (the shared ledger): when
every rank left an exit code, or when the Slurm job ended or was requeued by Slurm itself
without them (missing ranks count 137). ``signal_workers`` = ``scancel --signal=TERM``
(steps only), then ``scancel`` after the grace period; ``stop_workers`` = ``scancel``.
With warm processes (``warm``) an attempt may be a step of the job's allocation instead, and
a rank that restarts in process is held rather than signalled.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from shared.adapters.compute import launch_evidence
from shared.adapters.compute.attempt_scan import AttemptScan
from shared.adapters.compute.disk_evidence import evidence
from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.ledger import (
    SqliteLedger,
    all_ranks_exited,
    attempt_row,
    ranks_exited,
    workers_exited,
)
from shared.adapters.compute.protocol import ExitCode, read_exit_file, safe_name, with_message
from shared.adapters.compute.slurm import warm_scripts
from shared.adapters.compute.slurm.api import (
    REQUEUED_JOB_STATES,
    TERMINAL_JOB_STATES,
    SlurmApi,
    job_name,
)
from shared.adapters.compute.slurm.cli import SlurmError, SlurmPermanentError
from shared.adapters.compute.slurm.nodes import node_row
from shared.adapters.compute.slurm.ops import OpQueue, OpResult, log
from shared.adapters.compute.slurm.script_files import write_executable
from shared.adapters.compute.slurm.scripts import PeerTier, write_scripts
from shared.adapters.compute.slurm.settings import SlurmSettings
from shared.adapters.compute.slurm.view import SlurmView
from shared.adapters.compute.slurm.warm import SlurmWarm
from shared.adapters.compute.worker_logs import LogFile, tail_note
from shared.ports import Gang

EXIT_SUBMIT_FAILED = int(ExitCode.FAILED)
JOB_GONE_SETTLE_S = 1.0  # exit files land before the task ends; allow for a slow file system


class SlurmAttempts:
    """Attempts as Slurm batch jobs: the port's worker calls, the ``submit``, ``signal`` and
    ``cancel`` operations, and what ``poll()`` sees of mtc's own attempts. ``instance``
    names this state file's jobs in Slurm (``job_name``)."""

    def __init__(self, settings: SlurmSettings, store: FactStore, view: SlurmView,
                 cli: SlurmApi, ops: OpQueue, instance: str) -> None:
        self._settings = settings
        self._store = store
        self._view = view
        self._cli = cli
        self._ops = ops
        self._instance = instance
        self.scan = AttemptScan(self._store, self._node_of)  # checkpoints, heartbeats, ranks
        self.warm = SlurmWarm(view, self.run_dir, park_s=settings.park_s) \
            if settings.warm else None
        ops.register("submit", self._op_submit, self._done_submit, self._failed_submit)
        ops.register("signal", self._op_signal)
        ops.register("cancel", self._op_cancel)

    def job_log(self, job_id: str) -> Path:
        """Every attempt's Slurm output, appended (``--open-mode=append``)."""
        return self._settings.state_dir / "logs" / safe_name(job_id) / "slurm.out"

    def log_files(self, job_id: str) -> list[LogFile]:
        """Each attempt's output (``worker_logs``): the one file Slurm appends every attempt
        and rank to, as the attempt's record names it."""
        with self._store.tx() as db:
            rows = db.execute("SELECT attempt, output, finalized FROM attempts WHERE job_id = ?"
                              " ORDER BY attempt", (job_id,)).fetchall()
        return [LogFile(r["attempt"], None, r["output"], bool(r["finalized"])) for r in rows]

    def run_dir(self, job_id: str, attempt: int) -> Path:
        return self._settings.state_dir / "run" / safe_name(job_id) / f"attempt-{attempt}"


    def origin(self, job_id: str, attempt: int) -> str:
        """'slurm' for the run of a user's own job (``userjobs``), '' for mtc's."""
        with self._store.tx() as db:
            att = attempt_row(db, job_id, attempt)
        return "" if att is None else str(att["origin"])

    def slurm_job_id(self, job_id: str, attempt: int) -> int | None:
        with self._store.tx() as db:
            row = db.execute(
                "SELECT slurm_job_id FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
            ).fetchone()
        return None if row is None else cast("int | None", row["slurm_job_id"])

    def _op_submit(self, args: dict[str, Any]) -> OpResult:
        job_id, attempt = args["job_id"], args["attempt"]
        name = job_name(job_id, attempt, self._instance)
        existing = [j for j in self._cli.jobs() if j.name == name]
        if existing:  # submitted before, but the answer was lost: adopt it, never run twice
            return OpResult(True, data={"slurm_job_id": max(j.job_id for j in existing)})
        self.ensure_partition()
        nodes = list(args["slurm_nodes"])
        run_dir = Path(args["run_dir"])
        try:
            slurm_id = self._sbatch(name, nodes, run_dir, args["output"])
        except SlurmPermanentError as exc:
            if not self._settings.partition or "invalid partition" not in str(exc).lower():
                raise
            self._view.partition_ready = False  # slurmctld restarted without it (cluster.sh: -c)
            self.ensure_partition()
            slurm_id = self._sbatch(name, nodes, run_dir, args["output"])
        log.info("submitted %s as Slurm job %d on %s", name, slurm_id, ",".join(nodes))
        return OpResult(True, data={"slurm_job_id": slurm_id})

    def ensure_partition(self) -> None:
        if self._settings.partition and not self._view.partition_ready:
            members = ",".join(self._settings.allowed) if self._settings.allowed else "ALL"
            self._cli.ensure_partition(self._settings.partition, members)
            self._view.partition_ready = True

    def _sbatch(self, name: str, nodes: Sequence[str], run_dir: Path, output: str) -> int:
        return self._cli.submit(
            str(run_dir / "batch.sh"),
            nodes=len(nodes),
            job_name=name,
            requeue=True,
            open_mode="append",
            output=output,
            partition=self._settings.partition,
            extra_args=(
                f"--nodelist={','.join(nodes)}",
                f"--ntasks={len(nodes)}",
                "--ntasks-per-node=1",
                "--exclusive",
                f"--chdir={run_dir}",
            ),
        )

    def _op_signal(self, args: dict[str, Any]) -> OpResult:
        slurm_id = self.slurm_job_id(args["job_id"], args["attempt"])
        if slurm_id is None:
            return self._before_submit(args)
        try:
            self._cli.signal_job(slurm_id, "TERM")
        except SlurmPermanentError:
            job = next((j for j in self._cli.jobs() if j.job_id == slurm_id), None)
            if job is None or job.job_state in TERMINAL_JOB_STATES:
                return OpResult(True)  # already over: nothing left to tell
            if job.job_state == "PENDING" and self.origin(args["job_id"], args["attempt"]):
                return OpResult(True)  # a user's job between runs: never cancel it
            if job.job_state == "PENDING":  # nothing runs yet, so nothing to checkpoint
                self._cli.cancel(slurm_id)
                return OpResult(True)
            raise
        return OpResult(True)

    def _op_cancel(self, args: dict[str, Any]) -> OpResult:
        slurm_id = self.slurm_job_id(args["job_id"], args["attempt"])
        if slurm_id is None:
            return self._before_submit(args)
        try:
            self._cli.cancel(slurm_id)
        except SlurmPermanentError:
            job = next((j for j in self._cli.jobs() if j.job_id == slurm_id), None)
            if job is not None and job.job_state not in TERMINAL_JOB_STATES:
                raise
        return OpResult(True)

    def _before_submit(self, args: dict[str, Any]) -> OpResult:
        """Signal or cancel of an attempt whose sbatch has not gone through yet: wait for it,
        unless it failed (then the attempt is already over)."""
        with self._store.tx() as db:
            att = attempt_row(db, args["job_id"], args["attempt"])
        if att is None or att["finalized"]:
            return OpResult(True)
        return OpResult(False, transient=True, quiet=True, error="waiting for sbatch")

    # -- results

    def _done_submit(
        self, db: sqlite3.Connection, args: dict[str, Any], data: dict[str, Any], now: float
    ) -> None:
        db.execute(
            "UPDATE attempts SET slurm_job_id = ? WHERE job_id = ? AND attempt = ?",
            (data["slurm_job_id"], args["job_id"], args["attempt"]),
        )

    def _failed_submit(self, db: sqlite3.Connection, args: dict[str, Any], error: str, now: float) -> None:
        att = attempt_row(db, args["job_id"], args["attempt"])
        if att is not None and not att["finalized"]:
            self._finalize(db, att, EXIT_SUBMIT_FAILED, f"sbatch failed: {error}")

    # ------------------------------------------------------------ workers

    def start_workers(self, gang: Gang) -> None:
        """One ``sbatch`` per (job, attempt), one srun task per node; a repeat is a no-op."""
        job_id, attempt = gang.job_id, gang.attempt
        now = self._store.clock.now()
        with self._store.tx() as db:
            if attempt_row(db, job_id, attempt) is not None:
                return
            names = {n: self._slurm_name(db, n) for n in gang.node_ids}
            run_dir = self.run_dir(job_id, attempt)
            output = self.job_log(job_id)
            slurm_nodes = [names[n] or "" for n in gang.node_ids]
            self._store.ledger(db).start_attempt(
                job_id,
                attempt,
                gang.world_size,
                str(Path(gang.checkpoint_dir).absolute()),
                now,
                slurm_nodes=json.dumps(slurm_nodes),
                run_dir=str(run_dir),
                output=str(output),
            )
            missing = [n for n in gang.node_ids if not names[n]]
            if missing:
                att = attempt_row(db, job_id, attempt)
                assert att is not None
                self._finalize(db, att, EXIT_SUBMIT_FAILED, f"cannot submit: no Slurm node for {missing}")
                return
            try:
                write_scripts(
                    gang, names, run_dir, output, python=self._settings.python,
                    master_addr=self._settings.master_addr,
                    peer=PeerTier.for_master(self._settings.master_addr,
                                             self._settings.peer_budget_bytes),
                    previous_hosts=previous_hosts(db, job_id, attempt),
                    port_salt=str(self._settings.state_dir), warm=self.warm is not None,
                )
            except ValueError as exc:  # job input the scripts cannot carry safely
                att = attempt_row(db, job_id, attempt)
                assert att is not None
                self._finalize(db, att, EXIT_SUBMIT_FAILED, f"cannot submit: {exc}")
                return
            cancels: list[str] = []  # the job's allocation, released for this attempt's own
            if self.warm is not None and self._warm_start(db, gang, run_dir, slurm_nodes,
                                                          cancels):
                return
            key = f"submit:{job_id}:{attempt}"
            self._ops.put(
                db,
                key,
                "submit",
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "slurm_nodes": slurm_nodes,
                    "run_dir": str(run_dir),
                    "output": str(output),
                },
            )
        for cancel in cancels:
            self._ops.kick(cancel)
        self._ops.kick(key)

    def _warm_start(self, db: sqlite3.Connection, gang: Gang, run_dir: Path,
                    slurm_nodes: Sequence[str], cancels: list[str]) -> bool:
        """Run the attempt as a step of the job's allocation (True), or release that
        allocation for the attempt's own ``sbatch`` (False; its ``scancel`` in ``cancels``,
        run once the transaction is over)."""
        assert self.warm is not None
        reuse = self.warm.reusable(db, gang, slurm_nodes)
        if reuse is not None:
            slurm_id, alloc_dir = reuse
            self.warm.takes(db, gang)
            token = alloc_dir / "peer.token"  # the held ranks' peer stores check the host's
            if token.exists():
                write_executable(run_dir / "peer.token", token.read_text(), mode=0o600)
            db.execute("UPDATE attempts SET slurm_job_id = ? WHERE job_id = ? AND attempt = ?",
                       (slurm_id, gang.job_id, gang.attempt))
            warm_scripts.order(alloc_dir, gang.attempt, run_dir)
            log.info("job %s attempt %d runs in Slurm job %d (kept)", gang.job_id,
                     gang.attempt, slurm_id)
            return True
        self.warm.end(db, gang.job_id, self._store.clock.now())
        old = self.warm.host(db, gang, run_dir, slurm_nodes)
        host = None if old is None else attempt_row(db, gang.job_id, old)
        if host is not None and host["slurm_job_id"] is not None:
            cancels.append(self._cancel(db, host))  # its steps (held processes) with it
        return False

    def _slurm_name(self, db: sqlite3.Connection, node_id: str) -> str | None:
        row = node_row(db, node_id)
        return None if row is None or row["deleted"] else cast("str | None", row["slurm_node"])

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        """``scancel --signal=TERM`` now, ``scancel`` after ``grace_s`` (from ``poll()``). A
        repeat does not signal again; it can only bring the deadline closer."""
        now = self._store.clock.now()
        key = f"signal:{job_id}:{attempt}"
        with self._store.tx() as db:
            att = attempt_row(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            if SqliteLedger(db).signal(att, now, grace_s) and not (
                    self.warm is not None and self.warm.hold(db, job_id, attempt)):
                self._ops.put(db, key, "signal", {"job_id": job_id, "attempt": attempt})
        self._ops.kick(key)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        """``scancel`` the attempt's job now; harmless if it is gone."""
        with self._store.tx() as db:
            att = attempt_row(db, job_id, attempt)
            if att is None or att["finalized"]:
                return
            key = self._cancel(db, att)
            if self.warm is not None:
                self.warm.release(db, job_id)
        self._ops.kick(key)

    def _cancel(self, db: sqlite3.Connection, att: sqlite3.Row) -> str:
        db.execute(
            "UPDATE attempts SET cancel_sent = 1 WHERE job_id = ? AND attempt = ?",
            (att["job_id"], att["attempt"]),
        )
        key = f"cancel:{att['job_id']}:{att['attempt']}"
        self._ops.put(db, key, "cancel", {"job_id": att["job_id"], "attempt": att["attempt"]})
        return key

    def kill_all(self, wait_s: float = 15.0) -> None:
        """Cancel every Slurm job of an unfinished attempt (tests, demo shutdown) and wait up
        to ``wait_s`` for them to leave the nodes, so the next ``poll()`` reports them."""
        with self._store.tx() as db:
            atts = db.execute("SELECT * FROM attempts WHERE finalized = 0").fetchall()
            db.execute(
                "UPDATE ops SET status = 'done', error = 'kill_all' WHERE kind = 'submit'"
                " AND status IN ('pending', 'running')"
            )
            kept = db.execute("SELECT a.slurm_job_id FROM attempts a JOIN warm_allocs w ON"
                              " a.job_id = w.job_id AND a.attempt = w.host_attempt").fetchall()
            db.execute("DELETE FROM warm_allocs")
        ids = list({a["slurm_job_id"] for a in [*atts, *kept] if a["slurm_job_id"] is not None})
        for slurm_id in ids:
            with contextlib.suppress(SlurmError):
                self._cli.cancel(slurm_id)
        deadline = time.monotonic() + wait_s
        while ids and time.monotonic() < deadline:
            try:
                live = {j.job_id for j in self._cli.jobs() if j.job_state not in TERMINAL_JOB_STATES}
            except SlurmError:
                live = set(ids)
            if not live & set(ids):
                return
            time.sleep(0.2)

    def _finalize(self, db: sqlite3.Connection, att: sqlite3.Row, code: int, detail: str) -> None:
        ledger = self._store.ledger(db)
        self._store.queue(db, workers_exited(ledger, att["job_id"], att["attempt"], code, detail))

    def observe(self, db: sqlite3.Connection, now: float, fresh: bool) -> list[str]:
        keys: list[str] = []
        # mtc's own attempts: the runs of users' jobs are followed by slurm_userjobs
        for att in db.execute("SELECT * FROM attempts WHERE finalized = 0 AND origin = ''").fetchall():
            run_dir = Path(att["run_dir"])
            codes = {r: read_exit_file(run_dir / f"rank-{r}.exit") for r in range(att["world_size"])}
            if self.warm is not None:
                codes = self._warm_codes(db, att, now, codes, keys)
            self.scan_checkpoints(db, att, now, codes)
            if att["kill_deadline"] is not None and att["kill_deadline"] <= now and not att["cancel_sent"]:
                keys.append(self._cancel(db, att))
            slurm_id = att["slurm_job_id"]
            where = f" (Slurm job {slurm_id})" if slurm_id is not None else ""
            if all_ranks_exited(codes):
                self._finalize_codes(db, att, codes, where)
                continue
            if not fresh or slurm_id is None:
                continue  # nothing can be inferred from a controller that does not answer
            job = self._view.jobs.get(slurm_id)
            requeued = job is not None and (job.restart_cnt > 0 or job.job_state in REQUEUED_JOB_STATES)
            over = job is None or job.job_state in TERMINAL_JOB_STATES or requeued \
                or (self.warm is not None and (run_dir / "step.exit").exists())
            if not over:
                if att["gone_since"] is not None:
                    db.execute(
                        "UPDATE attempts SET gone_since = NULL WHERE job_id = ? AND attempt = ?",
                        (att["job_id"], att["attempt"]),
                    )
                continue
            if att["gone_since"] is None:
                db.execute(
                    "UPDATE attempts SET gone_since = ? WHERE job_id = ? AND attempt = ?",
                    (now, att["job_id"], att["attempt"]),
                )
                continue
            if now - att["gone_since"] < JOB_GONE_SETTLE_S:
                continue
            self.scan_checkpoints(db, att, now)
            codes = {r: read_exit_file(run_dir / f"rank-{r}.exit") for r in range(att["world_size"])}
            if self.warm is not None:
                codes = self._warm_codes(db, att, now, codes, keys)
            state = "gone from squeue" if job is None else job.job_state
            if requeued:
                state = "requeued by Slurm itself"
                if not att["cancel_sent"]:
                    keys.append(self._cancel(db, att))
            self._finalize_codes(db, att, codes, f"{where}, {state}; no exit file: killed")
        if self.warm is not None:
            self.warm.tick(db, now)
        return keys

    def _warm_codes(self, db: sqlite3.Connection, att: sqlite3.Row, now: float,
                    codes: Mapping[int, int | None], keys: list[str]) -> dict[int, int | None]:
        """The ranks' codes with those held and parked counted 75; a rank that failed while
        the attempt ran ends it: the others are held, or signalled where one cannot be."""
        assert self.warm is not None
        job_id, attempt = att["job_id"], att["attempt"]
        parked = self.warm.park(db, job_id, attempt, now)
        out = {r: parked.get(r) if c is None else c for r, c in codes.items()}
        failed = [r for r, c in codes.items() if c not in (None, 0)]
        if failed and att["signalled_at"] is None and not all_ranks_exited(out):
            run_dir = Path(att["run_dir"])
            first = min(failed, key=lambda r: (run_dir / f"rank-{r}.exit").stat().st_mtime_ns)
            self.warm.fail(db, job_id, attempt, first)
            if SqliteLedger(db).signal(att, now, self._settings.gang_grace_s) \
                    and not self.warm.hold(db, job_id, attempt):
                key = f"signal:{job_id}:{attempt}"
                self._ops.put(db, key, "signal", {"job_id": job_id, "attempt": attempt})
                keys.append(key)
        return out

    def _finalize_codes(
        self, db: sqlite3.Connection, att: sqlite3.Row, codes: Mapping[int, int | None], note: str
    ) -> None:
        first = first_failed(att, codes)
        if self.warm is not None:
            failed = self.warm.failed_rank(db, att["job_id"], att["attempt"])
            first = first if failed is None else failed
            if all(c == 0 for c in codes.values()):
                self.warm.release(db, att["job_id"])  # the job is done
        run_dir = self.run_dir(att["job_id"], att["attempt"])
        files = {r: run_dir / f"rank-{r}.exit" for r in codes}
        note = with_message(note, files, first)
        final = {r: int(ExitCode.KILLED) if c is None else c for r, c in codes.items()}
        if any(c not in (0, int(ExitCode.PREEMPTED)) for c in final.values()):
            note += tail_note(str(self.job_log(att["job_id"])), None)  # ranks interleaved
        full, disk = evidence(files, codes, first, self._settings.storage_floor)  # the launchers'
        launch, not_started = launch_evidence.evidence(files, codes, first)
        ledger = self._store.ledger(db)
        self.scan.forget(att["job_id"], att["attempt"])  # the scan's map holds live attempts
        self._store.queue(db, ranks_exited(ledger, att["job_id"], att["attempt"], codes,
                                           note + disk + not_started, first, storage_full=full,
                                           launch_failed=launch))

    def scan_checkpoints(self, db: sqlite3.Connection, att: sqlite3.Row, now: float,
                         codes: Mapping[int, int | None] | None = None) -> None:
        self.scan.scan(db, att, now, codes)

    def _node_of(self, db: sqlite3.Connection, att: sqlite3.Row) -> dict[int, str]:
        """The mtc node of each rank (rank r runs on the attempt's r-th Slurm node)."""
        hosts = list(json.loads(att["slurm_nodes"]))
        ids = {r["slurm_node"]: r["node_id"] for r in db.execute(
            "SELECT node_id, slurm_node FROM nodes WHERE slurm_node IS NOT NULL AND deleted = 0")}
        return {rank: ids.get(host, "") for rank, host in enumerate(hosts)}


def previous_hosts(db: sqlite3.Connection, job_id: str, attempt: int) -> list[str]:
    """The Slurm nodes of the job's previous attempt by rank (none: its first)."""
    row = db.execute("SELECT slurm_nodes FROM attempts WHERE job_id = ? AND attempt < ?"
                     " ORDER BY attempt DESC LIMIT 1", (job_id, attempt)).fetchone()
    return list(json.loads(row["slurm_nodes"])) if row else []


def first_failed(att: sqlite3.Row, codes: Mapping[int, int | None]) -> int | None:
    """The rank whose failure ended the gang (``srun --kill-on-bad-exit=1`` stopped the
    others), unless mtc itself signalled or cancelled the attempt first: a rank that left no
    exit file (its launcher was killed), else the failing rank whose exit file is oldest."""
    if att["signalled_at"] is not None or att["cancel_sent"]:
        return None
    vanished = [r for r, c in sorted(codes.items()) if c is None]
    if vanished:
        return vanished[0]
    run_dir = Path(att["run_dir"])
    stamped = []
    for rank, code in sorted(codes.items()):
        if code:
            with contextlib.suppress(OSError):
                stamped.append(((run_dir / f"rank-{rank}.exit").stat().st_mtime_ns, rank))
    return min(stamped)[1] if stamped else None
