"""What the control plane remembers about a job's restarts (state only; the rules that read
it are ``shared.policies.restarts`` and ``shared.domain.progress``).

* ``not_before``: a requeued job waits (PENDING) until then: the restart backoff;
* ``streak``: restarts in a row whose ended attempt made no progress (no checkpoint): the
  backoff's exponent; an attempt that saved a checkpoint starts a new streak;
  ``launch_failures``: restarts in a row because the platform could not start a rank (no
  program ran: not in the streak, a backoff of their own);
* ``failed_on``: per failed attempt (newest last, a few kept), the nodes still in service
  with evidence against them at the exit (a fault present, heartbeat lost, held SUSPECT):
  repeat offenders are read from it;
* ``excluded_node_ids``: nodes suspected of ending the job's attempts, kept out of its next
  placement (cleared when the job starts again);
* ``progress_at``: the newest progress of the running attempt (its start, then each new
  checkpoint); ``progress_interval_s`` the longest gap between progress seen so far (0: the
  job never reported progress, so the watchdog cannot judge it);
* ``early_exit``: the workers' exit of an attempt whose start is not visible yet. Compute
  answers from outside the transaction that asked it, so across processes the exit can come
  before that transaction commits (a commit retried for 20 s on a busy store). Kept here, it is
  announced again by the start that commits (``take_early_exit``), rather than redelivered
  until a delivery budget runs out and lost, which left a RUNNING job with no workers.
* ``decisions``: the recovery policy's choices (``shared.policies.recovery``), newest last,
  ``KEEP_DECISIONS`` kept: ``at, attempt, mode, incident, why, expected_lost_s, measured_s``
  (``measured_s``: from the incident to the new attempt's first progress, None until seen);
* ``replicas``: the data-parallel replicas a scaled-down attempt runs with (None: the spec's);
* ``attempt_started_at``, ``attempt_mode``: when the running attempt started, and how (a
  ``RecoveryPlan`` mode, "" when placed);
* ``tiers``: per checkpoint tier other than durable (those are ``Job.checkpoints``), the
  newest entry ``{step, at, attempt, save_s}``; ``startup``: measured startup seconds,
  ``cold`` and ``warm`` (JobStarted to JobFirstStep, less the restore);
* ``storage_full``: the file system (a path on it) that was full when the last attempt
  ended (``shared.domain.storage``): the job waits PENDING until it has room again, checked
  on every scheduling pass; ``storage_full_since`` when that began ("" / None: no wait);
  ``storage_full_times``: how many attempts ended so (a second is the program's failure:
  a job that fills its disk again would fill it again after every wait);
* ``stalled``: the restarts in a row whose attempt ended without progress, oldest first
  (``attempt, mode, rung, exit, restore``): the escalation ladder's count
  (``shared.policies.escalation``) and, when it is spent, the evidence the job fails with;
  ``restore_skip``: the tiers the next attempt's restore must not read (its rung's);
  ``restores``: what the newest attempts' ranks restored (``JobRestored``: ``attempt,
  step, tiers, failed, skipped``), a few kept;
* ``hung_on``: per hang seen (``shared.policies.hangs``), the node of its culprit rank, newest
  last (a few kept): a hang again on another node is the program's fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from shared.domain.events import JobWorkersExited

KEEP_DECISIONS = 20
KEEP_RESTORES = 6


class EarlyExit(NamedTuple):
    attempt: int
    exit_code: int
    detail: str = ""
    storage_full: str = ""
    launch_failed: str = ""


@dataclass
class JobRecovery:
    not_before: float | None = None
    streak: int = 0
    launch_failures: int = 0
    failed_on: list[list[str]] = field(default_factory=list)
    excluded_node_ids: list[str] = field(default_factory=list)
    progress_at: float | None = None
    progress_interval_s: float = 0.0
    early_exit: EarlyExit | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    replicas: int | None = None
    attempt_started_at: float | None = None
    attempt_mode: str = ""  # how the running attempt was started ("": placed)
    tiers: dict[str, dict[str, Any]] = field(default_factory=dict)
    startup: dict[str, float] = field(default_factory=dict)
    hung_on: list[str] = field(default_factory=list)
    storage_full: str = ""
    storage_full_since: float | None = None
    storage_full_times: int = 0
    stalled: list[dict[str, Any]] = field(default_factory=list)
    restore_skip: list[str] = field(default_factory=list)
    restores: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "not_before": self.not_before,
            "streak": self.streak,
            "launch_failures": self.launch_failures,
            "failed_on": [list(nodes) for nodes in self.failed_on],
            "excluded_node_ids": list(self.excluded_node_ids),
            "progress_at": self.progress_at,
            "progress_interval_s": self.progress_interval_s,
            "early_exit": None if self.early_exit is None else list(self.early_exit),
            "decisions": [dict(d) for d in self.decisions],
            "replicas": self.replicas,
            "attempt_started_at": self.attempt_started_at,
            "attempt_mode": self.attempt_mode,
            "tiers": {k: dict(v) for k, v in self.tiers.items()},
            "startup": dict(self.startup),
            "hung_on": list(self.hung_on),
            "storage_full": self.storage_full,
            "storage_full_since": self.storage_full_since,
            "storage_full_times": self.storage_full_times,
            "stalled": [dict(x) for x in self.stalled],
            "restore_skip": list(self.restore_skip),
            "restores": [dict(x) for x in self.restores],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> JobRecovery:
        d = d or {}
        return cls(
            not_before=d.get("not_before"),
            streak=d.get("streak", 0),
            launch_failures=int(d.get("launch_failures") or 0),
            failed_on=[list(nodes) for nodes in d.get("failed_on", [])],
            excluded_node_ids=list(d.get("excluded_node_ids", [])),
            progress_at=d.get("progress_at"),
            progress_interval_s=d.get("progress_interval_s", 0.0),
            early_exit=EarlyExit(*d["early_exit"]) if d.get("early_exit") else None,
            decisions=[dict(x) for x in d.get("decisions", [])],
            replicas=d.get("replicas"),
            attempt_started_at=d.get("attempt_started_at"),
            attempt_mode=d.get("attempt_mode", ""),
            tiers={k: dict(v) for k, v in (d.get("tiers") or {}).items()},
            startup=dict(d.get("startup") or {}),
            hung_on=list(d.get("hung_on") or []),
            storage_full=str(d.get("storage_full") or ""),
            storage_full_since=d.get("storage_full_since"),
            storage_full_times=int(d.get("storage_full_times") or 0),
            stalled=[dict(x) for x in d.get("stalled") or []],
            restore_skip=[str(t) for t in d.get("restore_skip") or []],
            restores=[dict(x) for x in d.get("restores") or []],
        )

    def decided(self, decision: dict[str, Any]) -> None:
        """Keep one policy choice (bounded: the newest ``KEEP_DECISIONS``)."""
        self.decisions.append(dict(decision))
        del self.decisions[:-KEEP_DECISIONS]

    def restored(self, record: dict[str, Any]) -> None:
        """Keep what an attempt restored (one per attempt: a repeat replaces it)."""
        self.restores = [r for r in self.restores if r.get("attempt") != record["attempt"]]
        self.restores.append(dict(record))
        self.restores.sort(key=lambda r: int(r.get("attempt", 0)))
        del self.restores[:-KEEP_RESTORES]

    def restore_of(self, attempt: int) -> dict[str, Any] | None:
        return next((r for r in self.restores if r.get("attempt") == attempt), None)

    def measured(self, attempt: int, at: float) -> None:
        """Attempt ``attempt``, the one after the incident's, has made progress at ``at``:
        the decision's measured seconds (from the incident), once."""
        for d in reversed(self.decisions):
            if d.get("attempt") == attempt - 1 and d.get("measured_s") is None:
                d["measured_s"] = round(max(0.0, at - float(d["at"])), 3)
                return

    def hold_early_exit(self, attempt: int, exit_code: int, detail: str,
                        storage_full: str = "", launch_failed: str = "") -> None:
        """Keep the exit of ``attempt``, whose start is not recorded yet (the newest wins:
        an attempt starts only after the one before it is recorded)."""
        if self.early_exit is None or attempt >= self.early_exit.attempt:
            self.early_exit = EarlyExit(attempt, exit_code, detail, storage_full, launch_failed)

    def take_early_exit(self, job_id: str, attempt: int) -> JobWorkersExited | None:
        """Attempt ``attempt`` has just started: the exit it already had, to announce again
        with its start (None: none held). A held exit of an older attempt is dropped."""
        held = self.early_exit
        if held is None or held.attempt > attempt:
            return None
        self.early_exit = None
        if held.attempt < attempt:
            return None
        return JobWorkersExited(job_id=job_id, attempt=attempt, exit_code=held.exit_code,
                                detail=held.detail, storage_full=held.storage_full,
                                launch_failed=held.launch_failed)
