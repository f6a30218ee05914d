"""Jobs users submit themselves: a plain ``sbatch --requeue`` in a partition mtc manages.

Discovery. Every fresh ``squeue --json`` is searched for RUNNING jobs in the managed
partitions (``user_job_partitions``, by default mtc's own) that mtc did not submit (their name
does not start with ``mtc-``), that Slurm may requeue (``--requeue``, or ``JobRequeue=1``),
and that run only on nodes mapped to mtc nodes. Each run is one attempt of the job
``slurm-<id>`` (attempt = Slurm's restart count + 1), recorded in the ``attempts`` table with
``origin = 'slurm'`` and reported once as ``JobAdopted``; the job service adopts it (a
CustomJob of origin "slurm") and allocates the nodes to it, so a fault on one of them drains
it and checkpoint-resume signals it as it would any job. At most ``MAX_USER_JOBS`` runs are
tracked at once (the rest get an alert); ended ones are forgotten after
``USER_JOB_RETENTION_S``.

Checkpoint. ``signal_workers`` is the same ``scancel --signal=TERM`` (job steps: the program
run with ``srun``); the grace period runs; then, instead of a cancel, ``scontrol requeue``
(which ends what still runs) and ``scontrol update StartTime=now`` (a requeued job otherwise
waits out a BeginTime delay). A job that ends on its own after the signal (it checkpointed
and exited) is requeued at once. The drained node is excluded by the drain itself: mtc
drains the node in Slurm before it signals the job. The comment ``mtc:checkpoint-dir=<dir>``
(relative to the job's working directory) says where its checkpoints are;
each new one is reported as ``JobCheckpointSaved``.

End of a run, from Slurm's view: requeued (restart count grew, or pending again) after mtc's
signal: its exit as Slurm recorded it before the requeue (137 if the requeue ended it);
requeued by Slurm itself (a node failure): 75, "resume me" (Slurm runs it again, mtc
follows); ended and not requeued: its exit status (0: succeeded); gone from ``squeue``: 137.
``JobWorkersExited`` carries it once. A requeue that fails for good ends the run with an
alert; the job then waits in PENDING in mtc (Slurm will not run it again).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.ledger import attempt_row, workers_exited
from shared.adapters.compute.protocol import ExitCode
from shared.adapters.compute.slurm.api import REQUEUED_JOB_STATES, TERMINAL_JOB_STATES, SlurmApi
from shared.adapters.compute.slurm.attempts import JOB_GONE_SETTLE_S, SlurmAttempts
from shared.adapters.compute.slurm.cli import SlurmJob, SlurmPermanentError
from shared.adapters.compute.slurm.ops import OpQueue, OpResult, log
from shared.adapters.compute.slurm.settings import SlurmSettings
from shared.adapters.compute.slurm.view import SlurmView
from shared.domain.adopted import SLURM_ORIGIN, adopted_job_id
from shared.domain.events import JobAdopted

USER_JOB_COLUMNS = {"origin": "TEXT NOT NULL DEFAULT ''", "requeue_sent": "INTEGER NOT NULL DEFAULT 0",
                    "ended_at": "REAL", "slurm_exit": "INTEGER"}
MAX_USER_JOBS = 256  # runs tracked at once: a bound on what one squeue can make mtc do
USER_JOB_RETENTION_S = 86_400.0
CHECKPOINT_COMMENT = "mtc:checkpoint-dir="
MTC_JOB_PREFIX = "mtc-"
KILLED = int(ExitCode.KILLED)


def checkpoint_dir(job: SlurmJob) -> str:
    """The job's checkpoint directory from its ``mtc:checkpoint-dir=`` comment, or ''."""
    for word in job.comment.split():
        if word.startswith(CHECKPOINT_COMMENT):
            path = Path(word[len(CHECKPOINT_COMMENT):])
            if not str(path):
                return ""
            base = Path(job.work_dir or "/")
            return str((path if path.is_absolute() else base / path).resolve())
    return ""


def migrate_user_jobs(store: FactStore) -> None:
    """Add the user-job columns to a state file from before them."""
    with store.tx() as db:
        cols = {r["name"] for r in db.execute("PRAGMA table_info(attempts)")}
        for name, kind in USER_JOB_COLUMNS.items():
            if name not in cols:
                db.execute(f"ALTER TABLE attempts ADD COLUMN {name} {kind}")


class SlurmUserJobs:
    """Adopts, checkpoints and requeues the jobs users submit with ``sbatch``: the
    ``requeue`` operation and what ``poll()`` sees of users' runs. A run's attempt is in the
    same ledger as mtc's own (``attempts`` scans its checkpoints)."""

    def __init__(self, settings: SlurmSettings, store: FactStore, view: SlurmView,
                 cli: SlurmApi, ops: OpQueue, attempts: SlurmAttempts) -> None:
        self._user_partitions = settings.user_partitions
        self._store = store
        self._view = view
        self._cli = cli
        self._ops = ops
        self._attempts = attempts
        ops.register("requeue", self._op_requeue, failed=self._failed_requeue)

    def user_job(self, job: SlurmJob) -> bool:
        """A job mtc did not submit, in a partition it manages, that Slurm may requeue."""
        return bool(self._user_partitions) and job.partition in self._user_partitions \
            and not job.name.startswith(MTC_JOB_PREFIX) and job.requeue

    # ------------------------------------------------------------ discovery

    def observe(self, db: sqlite3.Connection, now: float) -> list[str]:
        """Adopt new runs, follow tracked ones (fresh views only). Returns op keys to run."""
        keys: list[str] = []
        for att in db.execute(  # first the runs known: a requeue mtc asked for ends one
            "SELECT * FROM attempts WHERE finalized = 0 AND origin = ? ORDER BY attempt", (SLURM_ORIGIN,)
        ).fetchall():
            keys += self._follow(db, att, now)
        if self._user_partitions:
            self._adopt_runs(db, now)
        db.execute("DELETE FROM attempts WHERE origin = ? AND finalized = 1 AND ended_at < ?",
                    (SLURM_ORIGIN, now - USER_JOB_RETENTION_S))
        return keys

    def _adopt_runs(self, db: sqlite3.Connection, now: float) -> None:
        by_slurm = {r["slurm_node"]: r["node_id"] for r in db.execute(
            "SELECT node_id, slurm_node FROM nodes WHERE deleted = 0 AND provisioned = 1"
            " AND slurm_node IS NOT NULL AND role = 'worker'")}
        tracked = db.execute("SELECT COUNT(*) FROM attempts WHERE finalized = 0 AND origin = ?",
                             (SLURM_ORIGIN,)).fetchone()[0]
        for job in sorted(self._view.jobs.values(), key=lambda j: j.job_id):
            if job.job_state != "RUNNING" or not self.user_job(job):
                continue
            job_id, attempt = adopted_job_id(job.job_id), job.restart_cnt + 1
            if attempt_row(db, job_id, attempt) is not None:
                continue
            node_ids = [by_slurm.get(n) for n in job.node_list]
            if not node_ids or None in node_ids:
                continue  # not (only) on mtc's nodes: not mtc's to heal
            if tracked >= MAX_USER_JOBS:
                self._ops.alert(db, "user-jobs-limit", job_id,
                            f"{tracked} user jobs tracked already: Slurm job {job.job_id} is not healed")
                continue
            for old in db.execute("SELECT * FROM attempts WHERE job_id = ? AND attempt < ? AND finalized = 0",
                                  (job_id, attempt)).fetchall():  # rerun before mtc saw it end
                self._end_run(db, old, int(ExitCode.PREEMPTED), f"(Slurm job {job.job_id}) rerun by Slurm",
                              now)
            ckpt = checkpoint_dir(job)
            self._store.ledger(db).start_attempt(
                job_id, attempt, len(node_ids), ckpt, now, slurm_nodes=json.dumps(list(job.node_list)),
                run_dir="", output="", slurm_job_id=job.job_id, origin=SLURM_ORIGIN)
            tracked += 1
            log.info("adopted Slurm job %d (%s, user %s) run %d on %s", job.job_id, job.name, job.user,
                     attempt, job.nodes)
            self._store.queue(db, JobAdopted(
                job_id=job_id, attempt=attempt, node_ids=tuple(n for n in node_ids if n),
                slurm_job_id=job.job_id, name=job.name, user=job.user, partition=job.partition,
                command=job.command, checkpoint_dir=ckpt))

    # ------------------------------------------------------------ a tracked run

    def _follow(self, db: sqlite3.Connection, att: sqlite3.Row, now: float) -> list[str]:
        if att["checkpoint_dir"]:
            self._attempts.scan_checkpoints(db, att, now)
        slurm_id = int(att["slurm_job_id"])
        where = f"(Slurm job {slurm_id})"
        job = self._view.jobs.get(slurm_id)
        signalled = att["signalled_at"] is not None and not att["cancel_sent"]
        if job is None:
            if att["gone_since"] is None:
                self._set(db, att, gone_since=now)
            elif now - att["gone_since"] >= JOB_GONE_SETTLE_S:
                self._end_run(db, att, KILLED, f"{where} gone from squeue", now)
            return []
        requeued = job.restart_cnt + 1 > att["attempt"] or job.job_state in REQUEUED_JOB_STATES \
            or job.job_state == "PENDING"
        if requeued:
            if signalled or att["requeue_sent"]:  # its exit before the requeue, else killed by it
                code = att["slurm_exit"] if att["slurm_exit"] is not None else KILLED
                self._end_run(db, att, code, f"{where} requeued by mtc after SIGTERM", now)
            else:
                self._end_run(db, att, int(ExitCode.PREEMPTED), f"{where} requeued by Slurm itself", now)
            return []
        if job.job_state in TERMINAL_JOB_STATES:
            if signalled:  # it checkpointed and left: run it again now
                if att["slurm_exit"] is None and job.exit_status is not None:
                    self._set(db, att, slurm_exit=job.exit_status)  # Slurm resets it on requeue
                return self._requeue(db, att)
            code = job.exit_status if job.exit_status is not None else KILLED
            self._end_run(db, att, code, f"{where} {job.job_state}", now)
            return []
        deadline = att["kill_deadline"]
        if signalled and deadline is not None and deadline <= now:
            return self._requeue(db, att)  # the grace period is over: requeue ends it
        return []

    def _requeue(self, db: sqlite3.Connection, att: sqlite3.Row) -> list[str]:
        if att["requeue_sent"]:
            return []
        self._set(db, att, requeue_sent=1)
        key = f"requeue:{att['job_id']}:{att['attempt']}"
        self._ops.put(db, key, "requeue", {"job_id": att["job_id"], "attempt": att["attempt"],
                                          "slurm_job_id": att["slurm_job_id"]})
        return [key]

    @staticmethod
    def _set(db: sqlite3.Connection, att: sqlite3.Row, **values: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in values)  # names from this module, never a request
        db.execute(f"UPDATE attempts SET {cols} WHERE job_id = ? AND attempt = ?",
                   (*values.values(), att["job_id"], att["attempt"]))

    def _end_run(self, db: sqlite3.Connection, att: sqlite3.Row, code: int, detail: str, now: float) -> None:
        self._set(db, att, ended_at=now)
        ledger = self._store.ledger(db)
        self._store.queue(db, workers_exited(ledger, att["job_id"], att["attempt"], code, detail))

    def _op_requeue(self, args: dict[str, Any]) -> OpResult:
        slurm_id = int(args["slurm_job_id"])
        job = next((j for j in self._cli.jobs() if j.job_id == slurm_id), None)
        if job is None:
            return OpResult(True)  # gone: the next observation ends the run
        if job.restart_cnt + 1 <= args["attempt"] and job.job_state not in ("PENDING", *REQUEUED_JOB_STATES):
            self._cli.requeue(slurm_id)
            log.info("requeued Slurm job %d (run %d ends)", slurm_id, args["attempt"])
        try:
            self._cli.start_now(slurm_id)
        except SlurmPermanentError as exc:  # already started again, or held by its user
            log.info("Slurm job %d: StartTime=now not applied: %s", slurm_id, exc)
        return OpResult(True)

    def _failed_requeue(self, db: sqlite3.Connection, args: dict[str, Any], error: str, now: float) -> None:
        att = attempt_row(db, args["job_id"], args["attempt"])
        if att is not None and not att["finalized"]:
            job = self._view.jobs.get(int(args["slurm_job_id"]))
            code = job.exit_status if job is not None and job.exit_status is not None else KILLED
            why = f"(Slurm job {args['slurm_job_id']}) could not be requeued: {error}"
            self._end_run(db, att, code, why, now)
