"""Which facts the executor announced must be announced again (pure; time is passed in).

The executor publishes what the machines did (an attempt's exit, its first step) once, and
Pub/Sub delivers it at least once, until its retry budget is spent: then the message sits
in the dead-letter subscription and the store never hears of it. The job would stay
RUNNING with no workers. So the executor keeps a record of the attempt facts it announced
(``Announced``) and, now and then, compares it with the store's view of those jobs
(``JobView``): a fact the store is still missing, past the time the bus had to deliver it,
is re-announced with its original envelope (same CloudEvent source and id), so a handler
that did see it drops the copy as a duplicate (its idempotency record), and one that did
not acts on it as it would have.

Never re-announced (``SETTLED``, dropped from the record): a fact the store has recorded
(the job moved on from that attempt's RUNNING), or one it no longer needs (the job is
terminal, gone, or at a later attempt: an exit of an attempt the job moved past must not
end the attempt that replaced it). A fact of an attempt whose start the store has not
recorded yet waits (``WAIT``): the start commits first, then the exit is missing and sent.
Of several records of one (job, attempt, fact) (an adapter that published twice), only the
oldest is sent; the others wait and settle with it.

Bounds: a fact is first re-sent ``settle_s`` after it was announced, then with a doubling
gap up to ``max_gap_s``; at most ``per_pass`` are sent per pass, oldest first; a fact
announced more than ``horizon_s`` ago is given up (``EXPIRED``: logged, dropped).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

EXIT = "mtc.job.workers_exited.v1"
FIRST_STEP = "mtc.job.first_step.v1"
KINDS = (EXIT, FIRST_STEP)


class Verdict(enum.StrEnum):
    RESEND = "resend"
    WAIT = "wait"
    SETTLED = "settled"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Announced:
    """One fact the executor published: its envelope's id, what it says, when it was first
    published, how often and when last."""

    event_id: str
    kind: str  # EXIT or FIRST_STEP
    job_id: str
    attempt: int
    announced_at: float
    sends: int = 1
    last_sent: float | None = None  # None: announced_at

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.job_id, self.attempt, self.kind)


@dataclass(frozen=True)
class JobView:
    """What the store says of a job: its attempt, whether it is over, whether that attempt
    still runs (RUNNING or CANCELLING: its exit not recorded), and the newest attempt whose
    first step it recorded."""

    job_id: str
    attempt: int
    terminal: bool = False
    running: bool = True
    first_step_of: int = 0


@dataclass(frozen=True)
class Limits:
    settle_s: float = 120.0  # the bus's own delivery and retries come first
    max_gap_s: float = 1800.0
    per_pass: int = 20
    horizon_s: float = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Plan:
    resend: tuple[Announced, ...] = ()
    settled: tuple[Announced, ...] = ()
    expired: tuple[Announced, ...] = ()


def missing(fact: Announced, view: JobView | None) -> Verdict:
    """Whether the store still needs ``fact`` (RESEND), not yet (WAIT) or never (SETTLED),
    whatever the time."""
    if view is None or view.terminal or view.attempt > fact.attempt:
        return Verdict.SETTLED  # gone, over, or moved past this attempt: stale
    if view.attempt < fact.attempt:
        return Verdict.WAIT  # its start is not recorded yet
    if not view.running:
        return Verdict.SETTLED  # the attempt ended in the store: the exit was recorded
    if fact.kind == FIRST_STEP and view.first_step_of >= fact.attempt:
        return Verdict.SETTLED
    if fact.kind not in KINDS:
        return Verdict.SETTLED
    return Verdict.RESEND


def due_at(fact: Announced, limits: Limits) -> float:
    """When ``fact`` may be sent (again): ``settle_s`` after the last send, doubling with
    each send, at most ``max_gap_s``."""
    last = fact.announced_at if fact.last_sent is None else fact.last_sent
    gap = min(limits.max_gap_s, limits.settle_s * 2.0 ** max(0, fact.sends - 1))
    return last + max(limits.settle_s, gap)


def plan(facts: Iterable[Announced], views: Mapping[str, JobView], now: float,
         limits: Limits = Limits()) -> Plan:
    """What to re-announce now, what to forget, what to give up (see the module docstring)."""
    resend: list[Announced] = []
    settled: list[Announced] = []
    expired: list[Announced] = []
    chosen: set[tuple[str, int, str]] = set()
    for fact in sorted(facts, key=lambda f: (f.announced_at, f.event_id)):
        verdict = missing(fact, views.get(fact.job_id))
        if verdict is Verdict.SETTLED:
            settled.append(fact)
        elif now - fact.announced_at > limits.horizon_s:
            expired.append(fact)
        elif verdict is Verdict.RESEND and fact.key not in chosen:
            chosen.add(fact.key)  # a younger copy of the same fact waits behind it
            if now >= due_at(fact, limits) and len(resend) < limits.per_pass:
                resend.append(fact)
    return Plan(tuple(resend), tuple(settled), tuple(expired))
