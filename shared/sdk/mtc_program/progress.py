"""Progress per rank: step, compute vs wait seconds, and the collective last entered/left,
in the rank's heartbeat (``MTC_PROGRESS_FILE``) at a bounded rate (standard library only).

The control plane finds a hang and names its culprit from these files
(mtc's hang policy): the rank that did not enter the collective the others wait in,
or the one whose heartbeat stopped inside it. A rank blocked in a collective cannot write
from its training loop, so a daemon thread rewrites the file every ``interval_s`` from what
the loop last recorded; a stopped process (SIGSTOP, a dead GPU driver call) stops writing
altogether, and its heartbeat's ``time`` goes stale.

The plain file protocol, for programs that do not use this library: rewrite
``$MTC_PROGRESS_FILE`` atomically (write a temporary file, then rename it over) at least
every ``$MTC_PROGRESS_INTERVAL_S`` seconds, also while blocked, with a JSON object::

    {"rank": 0, "attempt": 1, "time": <unix s of this write>, "step": 42,
     "first_step_at": <unix s the first step of this process (or since its restore) ended,
                       null before it>,
     "progress_at": <unix s of the last step end or collective entry/exit>,
     "compute_s": <total s computing>, "wait_s": <total s inside collectives>,
     "steps": [[step, compute_s, wait_s], ...],        # the newest steps, 64 at most
     "collective": {"name": "all_reduce", "seq": 17, "state": "entered" | "left",
                    "at": <unix s>},
     "beat_every_s": 5.0}

``seq`` counts the collectives the rank entered in this attempt (1, 2, ...): every rank of a
data-parallel job enters the same sequence. ``TieredCheckpointer`` writes the same file; link
the two (``link``) and its heartbeat carries these fields too.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from mtc_program import protocol as n

KEEP_STEPS = 64  # the newest steps' timings a heartbeat carries (bounded size)
ENTERED, LEFT = "entered", "left"


class _Beating(Protocol):
    extra: Any

    def _heartbeat(self, force: bool = False) -> None: ...


class RankProgress:
    """What one rank's training loop did, written to its heartbeat by a daemon thread."""

    def __init__(self, path: Path | None, rank: int, attempt: int | None,
                 interval_s: float = 5.0) -> None:
        self.path, self.rank, self.attempt = path, rank, attempt
        self.interval_s = max(0.05, interval_s)
        self._lock = threading.Lock()
        self._step = 0
        self._compute = self._wait = 0.0
        self._in_step_wait = 0.0
        self._step_began = time.monotonic()
        self._progress_at = time.time()
        self._first_step_at: float | None = None
        self._steps: deque[tuple[int, float, float]] = deque(maxlen=KEEP_STEPS)
        self._seq = 0
        self._collective: dict[str, Any] | None = None
        self._linked: _Beating | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int) -> RankProgress:
        raw = env.get(n.PROGRESS_FILE, "").strip()
        attempt = env.get(n.JOB_ATTEMPT, "").strip()
        try:
            interval = float(env.get(n.PROGRESS_INTERVAL_S, "") or 5.0)
        except ValueError:
            interval = 5.0
        return cls(Path(raw) if raw else None, rank,
                   int(attempt) if attempt.isdigit() else None, interval)

    def link(self, checkpointer: _Beating) -> None:
        """One file, one writer: the checkpointer's heartbeat carries these fields, and this
        thread asks it to write."""
        checkpointer.extra = self.fields
        self._linked = checkpointer

    # ------------------------------------------------------------ the loop's calls

    def begin_step(self) -> None:
        """A step starts now (restore and set-up before it are no step's)."""
        with self._lock:
            self._step_began = time.monotonic()
            self._in_step_wait = 0.0

    @contextlib.contextmanager
    def collective(self, name: str) -> Iterator[int]:
        """Around one collective call: entered (with the next ``seq``), then left."""
        began = time.monotonic()
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._progress_at = time.time()
            self._collective = {"name": name, "seq": seq, "state": ENTERED,
                                "at": self._progress_at}
        try:
            yield seq
        finally:
            spent = time.monotonic() - began
            with self._lock:
                self._wait += spent
                self._in_step_wait += spent
                self._progress_at = time.time()
                self._collective = {"name": name, "seq": seq, "state": LEFT,
                                    "at": self._progress_at}

    def step_done(self, step: int) -> None:
        """Step ``step`` ended: its time less its collectives' is compute."""
        now = time.monotonic()
        with self._lock:
            total = now - self._step_began
            compute = max(0.0, total - self._in_step_wait)
            self._compute += compute
            self._steps.append((step, round(compute, 6), round(self._in_step_wait, 6)))
            self._step = step
            self._progress_at = time.time()
            if self._first_step_at is None:
                self._first_step_at = self._progress_at
            self._step_began, self._in_step_wait = now, 0.0
        self.start()

    # ------------------------------------------------------------ the heartbeat

    def fields(self) -> dict[str, Any]:
        """The fields this module adds to the heartbeat (see the module docstring)."""
        with self._lock:
            return {"progress_at": self._progress_at, "first_step_at": self._first_step_at,
                    "compute_s": round(self._compute, 6),
                    "wait_s": round(self._wait, 6), "steps": [list(s) for s in self._steps],
                    "collective": None if self._collective is None else dict(self._collective),
                    "beat_every_s": self.interval_s}

    def write(self) -> None:
        """Write the heartbeat now (best effort)."""
        if self._linked is not None:
            self._linked._heartbeat(force=True)
            return
        if self.path is None:
            return
        with self._lock:
            step = self._step
        body = {"rank": self.rank, "attempt": self.attempt, "pid": os.getpid(),
                "time": time.time(), "step": step, **self.fields()}
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(body))
            os.replace(tmp, self.path)

    def start(self) -> None:
        """The writer thread (once): it keeps writing while the loop is blocked."""
        if self._thread is None and (self.path is not None or self._linked is not None):
            self._thread = threading.Thread(target=self._run, name="mtc-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.write()
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.write()
