"""The executor's loop: pull compute requests, apply each once, let the machines report.

For each delivery, in the order received (in order per node, by the ordering key):

* malformed -> refused (to the dead-letter topic with the reason), acknowledged;
* already recorded (a redelivery, a duplicate, a handler that ran again) -> acknowledged,
  nothing applied;
* past its deadline -> refused and recorded, acknowledged, never applied: a drain or a
  reboot asked for minutes ago may be wrong now. A call the control plane waits on (a
  start of workers, a repair, a deep check) is answered as not done (``answers``), so the
  job is requeued, the repair planned again, the checks judged unknown;
* otherwise applied with the real adapter, recorded, acknowledged. A call that raises is
  not recorded and the delivery is nacked: it comes back (and, past the subscription's
  ``max_delivery_attempts``, goes to the dead-letter topic). Until it does, later requests
  with its ordering key that were already handed over are nacked too (held), so they are
  applied after it, as Pub/Sub redelivers them (at most ``HOLD_S`` or the failed request's
  deadline: one that was dead-lettered does not hold its node forever).

Applying and recording are not one transaction (Slurm is not transactional): a crash in
between applies the request again on redelivery, which the adapters make harmless (every
port call is idempotent by its key). Between pulls the adapter is polled, which is how its
results (node.provisioned, job.workers_exited, ...) are published, and the executor's
liveness record is overwritten every ``heartbeat_s``. What it published of an attempt (an
exit, a first step) is re-announced while the store is missing it (``reconcile``): a result
the bus dead-lettered does not leave its job RUNNING with no workers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.executor import placements
from services.executor.answers import refusal_answer
from services.executor.dedup import DedupRecord
from services.executor.placements import Placements
from services.observability import alerts
from shared.adapters.compute.remote.bus import Delivery, RequestSource
from shared.adapters.compute.remote.codec import ComputeRequest, apply, decode, start_nodes
from shared.domain.errors import PermanentError
from shared.ports import Clock, Compute, Emitter, Polled

log = logging.getLogger("mtc.executor")

EXECUTORS = alerts.EXECUTORS  # the liveness collection: one document per executor
APPLIED, DUPLICATE, REFUSED, MALFORMED, RETRY, HELD, SUPERSEDED = (
    "applied", "duplicate", "refused", "malformed", "retry", "held", "superseded")
HOLD_S = 120.0  # at most this long a key waits for its failed request to come back


class Refusals(Protocol):
    def refuse(self, data: bytes, attributes: Mapping[str, str], reason: str,
               service: str = "executor") -> None: ...


class Liveness(Protocol):
    def write(self, collection: str, doc_id: str, doc: dict[str, Any]) -> None: ...


class Ticking(Protocol):
    def tick(self) -> object:
        """A pass if one is due (the reconciler, ``services.executor.reconcile``)."""
        ...


class LoggedRefusals:
    """Refusals that are only logged (tests, and where no dead-letter topic exists)."""

    def __init__(self) -> None:
        self.refused: list[tuple[Mapping[str, str], str]] = []

    def refuse(self, data: bytes, attributes: Mapping[str, str], reason: str,
               service: str = "executor") -> None:
        self.refused.append((dict(attributes), reason))


@dataclass
class Executor:
    """One executor (see the module docstring). ``compute`` is the real adapter; its
    ``poll()``, where it has one, is called after every pull."""

    source: RequestSource
    compute: Compute
    dedup: DedupRecord
    clock: Clock
    refusals: Refusals = field(default_factory=LoggedRefusals)
    liveness: Liveness | None = None
    report: Emitter | None = None  # where a refused call's answer goes (the event topics)
    reconciler: Ticking | None = None  # re-announces what the store is missing
    placements: Placements | None = None  # a start is applied once the store shows it
    commit_poll_s: float = 5.0  # how long a start waits in hand for its commit before a nack
    executor_id: str = "executor"
    kind: str = ""
    heartbeat_s: float = 5.0
    batch: int = 50
    counts: Counter[str] = field(default_factory=Counter)
    _held: dict[str, tuple[str, float]] = field(default_factory=dict)
    _last_beat: float = float("-inf")
    _started_at: float | None = None

    def handle(self, delivery: Delivery) -> str:
        """What happened to one delivery (APPLIED, DUPLICATE, REFUSED, MALFORMED, RETRY or
        HELD)."""
        try:
            request = decode(delivery.data, delivery.attributes, delivery.ordering_key)
        except PermanentError as exc:
            self._refuse(delivery, f"malformed compute request: {exc}")
            delivery.ack()
            return self._count(MALFORMED)
        now = self.clock.now()
        held = self._held.get(request.ordering_key)
        if held is not None:
            if now > held[1]:
                del self._held[request.ordering_key]
            elif held[0] != request.request_id:
                delivery.nack()  # after the failed one, which comes back first
                return self._count(HELD)
        outcome = self._handle(delivery, request, now)
        if outcome == RETRY:
            self._held[request.ordering_key] = (request.request_id,
                                                min(request.deadline, now + HOLD_S))
        elif held is not None and held[0] == request.request_id:
            self._held.pop(request.ordering_key, None)
        return outcome

    def _handle(self, delivery: Delivery, request: ComputeRequest, now: float) -> str:
        if self.dedup.seen(request.request_id) is not None:
            delivery.ack()
            return self._count(DUPLICATE)
        if request.expired(now):
            late = f"past its deadline by {now - request.deadline:.1f} s"
            if not self._answer(delivery, request, f"refused by the executor, {late}", now):
                return self._count(RETRY)
            self._refuse(delivery, f"{request.op} {request.ordering_key}: {late} "
                         f"(issued {request.issued_at:.3f}); not applied")
            self.dedup.record(request.request_id, request.op, REFUSED, request.deadline, now)
            delivery.ack()
            return self._count(REFUSED)
        if request.op == "start_workers" and self.placements is not None:
            decided = self._placement(request, now)
            if decided == placements.WAIT:
                log.info("start_workers %s (%s) waits for its attempt's commit",
                         request.ordering_key, request.request_id)
                delivery.nack()  # its transaction may still be committing: it comes back
                return self._count(RETRY)
            if decided != placements.APPLY:
                log.warning("start_workers %s (%s) not applied: %s", request.ordering_key,
                            request.request_id, decided)
                delivery.ack()
                return self._count(SUPERSEDED)
        try:
            apply(request, self.compute)
        except PermanentError as exc:
            if not self._answer(delivery, request, f"refused by the executor: {exc}", now):
                return self._count(RETRY)
            self._refuse(delivery, f"{request.op} {request.ordering_key}: {exc}")
            self.dedup.record(request.request_id, request.op, MALFORMED, request.deadline, now)
            delivery.ack()
            return self._count(MALFORMED)
        except Exception:
            log.exception("applying %s %s failed; it will be redelivered", request.op,
                          request.request_id)
            delivery.nack()
            return self._count(RETRY)
        self.dedup.record(request.request_id, request.op, APPLIED, request.deadline, now)
        delivery.ack()
        log.info("applied %s %s (%s)", request.op, request.ordering_key, request.request_id)
        return self._count(APPLIED)

    def _placement(self, request: ComputeRequest, now: float) -> str:
        """``placements.verdict`` on the store, asked again for up to ``commit_poll_s`` while
        the attempt is not there yet: the publish comes just before its commit, and a nack
        at once would spend the subscription's delivery attempts in a second."""
        assert self.placements is not None
        args = request.args
        first = args["gang"] if "gang" in args else args["workers"][0]
        deadline, pause = time.monotonic() + self.commit_poll_s, 0.05
        while True:
            try:
                placed = self.placements.placed(str(first["job_id"]))
            except Exception:  # the store is not reachable now: as not yet committed
                log.exception("reading the store for %s failed", request.ordering_key)
                placed = None
            decided = placements.verdict(int(first["attempt"]), start_nodes(args), placed,
                                         now - request.issued_at)
            if decided != placements.WAIT or time.monotonic() + pause > deadline:
                return decided
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _count(self, outcome: str) -> str:
        self.counts[outcome] += 1
        return outcome

    def _answer(self, delivery: Delivery, request: ComputeRequest, reason: str, now: float
                ) -> bool:
        """Tell the control plane a call it waits on was not done (``answers``), before the
        refusal is recorded: a crash in between repeats the answer, never loses it. False
        (and the delivery nacked, to come back) when it could not be sent."""
        answer = refusal_answer(request, reason, now)
        if answer is None or self.report is None:
            return True
        try:
            self.report(answer)
        except Exception:
            log.exception("could not answer refused %s %s; it will be redelivered",
                          request.op, request.request_id)
            delivery.nack()
            return False
        log.info("answered refused %s %s with %s", request.op, request.ordering_key,
                 answer.TYPE)
        return True

    def _refuse(self, delivery: Delivery, reason: str) -> None:
        log.warning("refused compute request %s: %s",
                    delivery.attributes.get("mtc-request-id", "?"), reason)
        try:
            self.refusals.refuse(delivery.data, delivery.attributes, reason)
        except Exception as exc:  # the refusal is logged; the request is still not applied
            log.warning("could not publish the refusal: %s", exc)

    def step(self, timeout_s: float = 1.0) -> int:
        """One pull (waiting up to ``timeout_s``), its deliveries handled in order, one
        poll of the machines, a reconciler pass and the liveness record if due; returns how
        many were handled."""
        deliveries = self.source.receive(self.batch, timeout_s)
        for delivery in deliveries:
            self.handle(delivery)
        if isinstance(self.compute, Polled):
            try:
                self.compute.poll()
            except Exception:
                log.exception("polling the machines failed")
        if self.reconciler is not None:
            try:
                self.reconciler.tick()
            except Exception:  # the store unreachable: the next pass tries again
                log.exception("reconciling the announced facts with the store failed")
        self.beat()
        return len(deliveries)

    def beat(self, *, force: bool = False) -> None:
        """Overwrite ``executors/<id>`` with when this executor was last alive (state, not
        an event stream: the control plane reads its age)."""
        now = self.clock.now()
        if self._started_at is None:
            self._started_at = now
        if self.liveness is None or (not force and now - self._last_beat < self.heartbeat_s):
            return
        self._last_beat = now
        self.dedup.prune(now)
        doc = {"executor_id": self.executor_id, "last_seen": now,
               "started_at": self._started_at, "compute": self.kind,
               "host": socket.gethostname(), "pid": os.getpid(),
               "heartbeat_s": self.heartbeat_s, "counts": dict(self.counts),
               "expire_at": now + 7 * 24 * 3600.0}
        try:
            self.liveness.write(EXECUTORS, self.executor_id, doc)
        except Exception as exc:  # a missed beat reads as silence, which is the truth
            log.warning("could not record liveness: %s", exc)

    def run(self, stop: threading.Event, poll_s: float = 0.1) -> None:
        """Until ``stop``: requests are handled as they arrive, and the machines are polled
        at least every ``poll_s`` (how soon an exit, a checkpoint or a node agent's report
        is published)."""
        self.beat(force=True)
        while not stop.is_set():
            try:
                self.step(poll_s)
            except Exception:  # the bus unreachable: keep going, the beat says how long
                log.exception("executor step failed")
                stop.wait(1.0)


def request_of(delivery: Delivery) -> ComputeRequest:
    """Decode a delivery (tools and tests)."""
    return decode(delivery.data, delivery.attributes, delivery.ordering_key)
