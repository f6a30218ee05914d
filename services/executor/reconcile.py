"""The executor's reconciler: re-announce the attempt facts the store is missing.

A pass (at most every ``every_s``, from the executor's loop) reads the executor's record of
what it announced (``AnnouncedRecord``), reads the store's view of those jobs
(``JobViews``), and lets the policy (``shared.policies.reconcile.plan``) say what to
publish again (the original envelope, so handlers' idempotency drops a copy they had),
what to forget and what to give up. It lives in the executor, not in a scheduled function,
because only the executor holds what it announced: an exit's code and detail exist nowhere
else once the bus lost them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from services.executor.announced import AnnouncedRecord
from shared.adapters.docstore import DocUnitsOfWork
from shared.domain.events import Envelope
from shared.domain.model import Job, JobState
from shared.policies.reconcile import JobView, Limits, Plan, plan
from shared.ports import Clock, DocStore

log = logging.getLogger("mtc.executor")


class JobViews(Protocol):
    def views(self, job_ids: Collection[str]) -> Mapping[str, JobView]:
        """The store's view of each job that exists; a job it does not hold is left out.
        Raises when the store cannot be read (a pass is then skipped, nothing forgotten)."""
        ...


def view_of(job: Job) -> JobView:
    rec = job.recovery
    measured = max(int(rec.startup.get("warm_attempt", 0)),
                   int(rec.startup.get("cold_attempt", 0)))
    if rec.attempt_started_at is None:  # a start the store never timed: nothing to measure
        measured = job.attempt
    return JobView(job.job_id, job.attempt, terminal=job.terminal,
                   running=job.state in (JobState.RUNNING, JobState.CANCELLING),
                   first_step_of=measured)


class StoreJobViews:
    """``JobViews`` over the control plane's document store, in one read-only transaction."""

    def __init__(self, store: DocStore) -> None:
        self._uow = DocUnitsOfWork(store)

    def views(self, job_ids: Collection[str]) -> Mapping[str, JobView]:
        out: dict[str, JobView] = {}
        with self._uow(read_only=True) as uow:
            for job_id in job_ids:
                job = uow.jobs.get(job_id)
                if job is not None:
                    out[job_id] = view_of(job)
        return out


@dataclass
class Reconciler:
    """One executor's reconciler (see the module docstring). ``publish`` takes an envelope
    as it was first published (the event topics, not the recording publisher)."""

    record: AnnouncedRecord
    views: JobViews
    publish: Callable[[Envelope], None]
    clock: Clock
    limits: Limits = field(default_factory=Limits)
    every_s: float = 30.0
    scan: int = 500  # records read per pass: the oldest first
    _last: float = float("-inf")

    def tick(self) -> Plan | None:
        """A pass if one is due (None if not)."""
        now = self.clock.now()
        if self.every_s <= 0 or now - self._last < self.every_s:
            return None
        self._last = now
        return self.run_once()

    def run_once(self) -> Plan:
        now = self.clock.now()
        facts = self.record.facts(now - self.limits.settle_s, self.scan)
        if not facts:
            return Plan()
        decided = plan(facts, self.views.views({f.job_id for f in facts}), now, self.limits)
        for fact in decided.resend:
            envelope = self.record.envelope(fact.event_id)
            if envelope is None:
                continue
            self.publish(envelope)  # raises: the pass ends here, the rest waits for the next
            self.record.sent(fact.event_id, now)
            log.warning("re-announced %s of job %s attempt %d (%s), which the store is "
                        "still missing %.0f s after it was first published (send %d)",
                        fact.kind, fact.job_id, fact.attempt, fact.event_id,
                        now - fact.announced_at, fact.sends + 1)
        for fact in decided.expired:
            log.error("gave up re-announcing %s of job %s attempt %d (%s): the store is "
                      "still missing it %.0f s after it was first published", fact.kind,
                      fact.job_id, fact.attempt, fact.event_id, now - fact.announced_at)
        self.record.forget(f.event_id for f in decided.settled + decided.expired)
        return decided
