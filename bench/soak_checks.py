"""The chaos soak's invariants on jobs and on the store, checked against the control plane's
state: a job ends as its program and the policy say, a job makes progress while there is
capacity for it (stated from the scheduling policy, apart from the scheduler), and the event
log and the idempotency records stay within their retention. The nodes' invariants are
:mod:`bench.soak_node_checks`.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from bench.soak_controller import PROGRESS_TIMEOUT_S
from bench.soak_ranks import describe_ranks
from bench.soak_records import PlannedJob, disk_full
from bench.soak_settings import FINAL_QUIET_S, RETENTION_SLACK_S, SETTINGS
from shared.config import ControlPlaneConfig
from shared.domain import lifecycle, progress
from shared.domain.model import Job, JobState, Node, NodeRole, NodeState

if TYPE_CHECKING:
    from bench.soak import Soak


class JobChecks:
    """Every submitted job: accounted for, making progress, ending as it should."""

    def __init__(self, soak: Soak) -> None:
        self.s = soak

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
                    out[job.job_id] = (False, f"backing off until {self.s.rel(nb):.0f} s")
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

    def check(self, nodes: dict[str, list[Node]], jobs: dict[str, Job], now: float) -> None:
        room = self.room(nodes, jobs, now)
        for p in self.s.jobs.values():
            if not p.submitted:
                continue
            job = jobs.get(p.job_id)
            self.s.check("job accounted for")
            if job is None:
                self.s.violate(("job-missing", p.job_id), "job accounted for",
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
            self.s.check("job makes progress")
            quiet_s = self.s.elapsed(p.changed_at, now)
            if waiting and p.capacity_since is not None:
                quiet_s = min(quiet_s, self.s.elapsed(p.capacity_since, now))
            if p.capacity_since is not None and quiet_s > self.s.stuck_job_s:
                self.s.violate(("stuck-job", p.job_id, sig), "job makes progress",
                               f"{p.job_id} ({p.replicas}x{p.steps} steps) {job.state.value} "
                               f"attempt {job.attempt}, last checkpoint step "
                               f"{latest.step if latest else None}, no change for "
                               f"{now - p.changed_at:.0f} s with capacity for it "
                               f"(nodes {job.node_ids}{'; ' + why if waiting else ''})"
                               f"{self.hang_note(p.job_id, job.attempt)}")

    def hang_note(self, job_id: str, attempt: int = 0) -> str:
        """What the soak did to the job (a SIGSTOP), then what its ranks are doing."""
        note = f"; {self.s.hung[job_id]}" if job_id in self.s.hung else ""
        try:
            with self.s.compute_db() as db:
                return note + describe_ranks(db, job_id, attempt)
        except sqlite3.Error as exc:
            return f"{note}; compute ledger: unknown ({exc})"

    def check_final(self, p: PlannedJob, job: Job) -> None:
        self.s.check("job ends as program and policy say")
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
            self.s.violate(("final", p.job_id), "job ends as program and policy say",
                           f"{p.job_id} ({p.replicas}x{p.steps} steps) ended "
                           f"{job.state.value}, want {want}; restarts {job.restart_count}, "
                           f"restartJobOnWorkerRestart {p.restart_anyway}, "
                           f"error: {job.error!r}")

    def final(self, nodes: dict[str, list[Node]], jobs: dict[str, Job], now: float) -> None:
        """After the settle time: no job left unfinished that has been quiet with room."""
        room = self.room(nodes, jobs, now)
        for p in self.s.jobs.values():
            job = jobs.get(p.job_id)
            if job is None or job.terminal:
                continue
            self.s.check("job makes progress")
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
                self.s.violate(("unfinished", p.job_id), "job makes progress",
                               f"{p.job_id} ({p.replicas}x{p.steps} steps) still "
                               f"{job.state.value} (attempt {job.attempt}) {self.s.settle_s:.0f} s "
                               f"after the chaos ended, no change for {quiet:.0f} s "
                               f"({why or 'running'}){self.hang_note(p.job_id, job.attempt)}")
            else:
                p.final = f"{job.state.value} (at the end: " + (
                    "capacity only just back)" if waiting else "still progressing)")


class StoreChecks:
    """The event log and the idempotency records are pruned."""

    def __init__(self, soak: Soak) -> None:
        self.s = soak
        self.over_bound: dict[str, tuple[str, float]] = {}  # collection -> (oldest id, seen)

    def doc_counts(self) -> dict[str, Any]:
        conn = sqlite3.connect(self.s.state_dir / "mtc.db", timeout=30.0)
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

    def check(self, now: float) -> None:
        """The event log and the idempotency records are pruned: nothing stays past its
        retention (+ the prune interval and slack). A document written late with an old
        time (a replayed envelope) is only over the bound if it is still there a prune
        interval later."""
        counts = self.doc_counts()
        self.s.fig.doc_samples.append({"t_s": round(self.s.rel(now), 1),
                                       **{c: v["count"] for c, v in counts.items()}})
        bound = SETTINGS["retention_s"] + SETTINGS["prune_interval_s"] + RETENTION_SLACK_S
        for collection in ("events", "processed_events"):
            entry = counts.get(collection)
            self.s.check("state within retention")
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
                self.s.violate(("retention", collection, doc_id), "state within retention",
                               f"{collection}: document {doc_id[:12]} is {age:.0f} s old and "
                               f"unpruned for {now - first_seen:.0f} s, bound {bound:.0f} s "
                               f"(retention {SETTINGS['retention_s']:.0f} s + prune interval + "
                               f"slack); {entry['count']} documents")
