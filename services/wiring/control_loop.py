"""The embedded control plane's own thread: it delivers the bus, ticks the fleet and prunes on
its own cadence, so no request (and no client that stalls one) ever holds up healing.

Requests only commit their unit of work (its events land in the outbox in the same
transaction) and ``nudge`` the loop; ``LoopRuntime`` is the API's side of that contract.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.api.context import READING
from services.wiring.api import EmbeddedApiRuntime
from services.wiring.embedded import EmbeddedApp
from shared.adapters.docstore import CLUSTERS
from shared.domain.errors import StorageFull
from shared.handling import Deps

log = logging.getLogger("mtc.loop")

Chore = Callable[[], object]


STORAGE_RETRY_S = 2.0  # a pass the full state storage refused is tried again this often


@dataclass
class LoopHealth:
    """What ``/readyz`` asks of the loop: alive, and a fleet tick not long ago."""

    alive: bool
    last_tick_age_s: float | None  # None: no tick finished yet
    last_error: str | None


class ControlLoop:
    """Pump a bounded slice, tick when due, run the chores (pruning) when due; then sleep
    until ``pump_s`` passes or a request nudges. A pass that raises is logged and the loop
    goes on: the thread that heals must not die of one bad event."""

    def __init__(self, app: EmbeddedApp, *, pump_s: float = 0.1, budget_s: float = 0.5,
                 tick_s: float = 5.0, chore_s: float = 600.0,
                 chores: tuple[Chore, ...] = ()) -> None:
        self.app = app
        self.pump_s = pump_s
        self.tick_s = tick_s
        # a slice of delivery and the fleet tick when due: what a call does in process
        self._deliver = EmbeddedApiRuntime(app, budget_s=budget_s, tick_s=tick_s)
        self.chore_s = chore_s
        self.chores = chores
        self._wake = threading.Condition()
        self._nudged = False
        self._passes = 0  # passes finished, under _wake
        self._in_pass = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_chores = 0.0
        self._last_error: str | None = None

    # ------------------------------------------------------------ the loop's side

    def step(self) -> None:
        """One pass (the thread runs it over and over; tests may call it directly)."""
        self._deliver.after_request()
        now = time.monotonic()
        if now >= self._next_chores:
            for chore in self.chores:
                chore()
            self._next_chores = now + self.chore_s

    def _run(self) -> None:
        while not self._stopping.is_set():
            with self._wake:
                self._in_pass = True
            pause_s = self.pump_s
            try:
                self.step()
                self._last_error = None
            except StorageFull as exc:  # the state cannot grow: say so, keep trying
                log.error("control loop pass not committed: %s", exc)
                self._last_error = f"{type(exc).__name__}: {exc}"
                pause_s = STORAGE_RETRY_S
            except Exception as exc:  # logged, and the next pass retries
                log.exception("control loop pass failed")
                self._last_error = f"{type(exc).__name__}: {exc}"
            with self._wake:
                self._passes += 1
                self._in_pass = False
                self._wake.notify_all()
                if not self._nudged and not self._stopping.is_set():
                    self._wake.wait(pause_s)
                self._nudged = False

    def start(self) -> ControlLoop:
        self._thread = threading.Thread(target=self._run, name="mtc-control-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the pass under way, then return (before the store closes)."""
        self._stopping.set()
        self.nudge()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ------------------------------------------------------------ the requests' side

    def nudge(self) -> None:
        """Something was committed: start the next pass now rather than after ``pump_s``."""
        with self._wake:
            self._nudged = True
            self._wake.notify_all()

    def settle(self, timeout_s: float) -> bool:
        """Nudge, and wait (at most ``timeout_s``) for a pass that began after the nudge to
        finish: a request's events are then delivered, or it stops waiting and answers."""
        with self._wake:
            self._nudged = True
            self._wake.notify_all()
            # a pass under way may have read the outbox before this commit: wait for the next
            target = self._passes + (2 if self._in_pass else 1)
            deadline = time.monotonic() + timeout_s
            while self._passes < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive:
                    return False
                self._wake.wait(left)
            return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> LoopHealth:
        last = self._deliver.last_tick
        return LoopHealth(self.alive, None if last is None else time.monotonic() - last,
                          self._last_error)


@dataclass
class LoopRuntime:
    """The API's runtime over a running ``ControlLoop``: after a call that changes something
    the request nudges the loop and waits a bounded ``settle_s`` for it to deliver, so a GET
    after it shows its effects; a GET (``READING``) committed nothing and never waits: the
    loop's pass, its writes included, is not a read's business. It never delivers, ticks or
    polls compute itself."""

    loop: ControlLoop
    settle_s: float = 0.5
    deps: Deps = field(init=False)

    def __post_init__(self) -> None:
        self.deps = self.loop.app.deps

    def after_request(self) -> None:
        if not READING.get():
            self.loop.settle(self.settle_s)


def readiness(app: EmbeddedApp, loop: ControlLoop, *, stale_s: float | None = None
              ) -> dict[str, Callable[[], str | None]]:
    """``/readyz``'s checks, each None when ready or the reason it is not: the store answers
    a read; the loop runs and ticked within ``stale_s`` (default three ticks)."""
    stale = stale_s if stale_s is not None else 3 * loop.tick_s

    def store() -> str | None:
        app.store.read(CLUSTERS, {"cluster_id": "readyz"})
        return None

    def controller() -> str | None:
        h = loop.health()
        if not h.alive:
            return "control loop not running"
        if h.last_error is not None and h.last_error.startswith(StorageFull.__name__):
            return h.last_error  # names the state directory: the operator's next step
        if h.last_tick_age_s is None:
            return "no fleet tick yet"
        if h.last_tick_age_s > stale:
            return f"last fleet tick {h.last_tick_age_s:.0f} s ago (over {stale:g} s)"
        return None

    return {"store": store, "controller": controller}
