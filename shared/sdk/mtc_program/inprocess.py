"""In-process restart: a rank whose process is alive goes through a recovery without a new
process (NVIDIA resiliency-ext's in-process restart, HyperPod's process-level restart).

Standard library only: the adapters import it (they write orders and read the answers).

The managed environment names a control file per process (``MTC_RESTART_FILE``). A program
that can drop its current step and restore in process says so with ``declare()``, then
``poll()``s between steps (a ``stat``, microseconds). The adapter writes an ``Order``
(JSON, replaced atomically, a ``generation`` that only grows):

* ``hold``: the attempt ends (another rank failed, or the control plane asked the gang to
  stop). The program does what SIGTERM would make it do short of exiting (its preemption
  save), answers ``held(order)`` and ``wait()``s. A hold has a ``deadline``: with no
  restart by then the program exits as on SIGTERM (the adapter also ends a held process it
  does not take into the next attempt, so nothing lingers);
* ``restart``: the next attempt takes this process. ``apply(order)`` puts the new attempt's
  managed environment into ``os.environ`` (rank, world size, attempt, tier directories)
  and moves stdout/stderr to the attempt's log; the program then restores from its tiers
  (the consistent cut) as a fresh start would and goes on.

The program's answers go to ``<control file>.state`` (JSON: ``pid``, the ``held``
generation, the ``applied`` one): the adapter counts a rank as out of the attempt only once
it has answered ``held`` (its save is complete), and knows whom to signal by ``pid``.
A program that never calls ``declare()`` is restarted as a new process, as any program is.

A *warm standby* is a process the adapter starts beside a job that declared, with
``MTC_STANDBY=1``: the program imports, declares and calls ``standby()`` before it trains;
when a rank's process dies and the next attempt is in place, that rank is given to the
standby by a ``restart`` order (the same path as a held rank), without the start-up cost.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mtc_program.protocol import RESTART_FILE, RESTORE_SKIP, STANDBY

__all__ = ["HOLD", "RESTART", "RESTART_FILE", "STANDBY", "InProcessRestart", "Order",
           "atomic_write", "read_order", "read_state", "state_path"]

HOLD, RESTART = "hold", "restart"
STATE_SUFFIX = ".state"


@dataclass(frozen=True)
class Order:
    """What the adapter asks of a live rank (one generation of the control file)."""

    generation: int
    action: str  # HOLD or RESTART
    env: dict[str, str] = field(default_factory=dict)  # RESTART: the new managed environment
    log_path: str = ""  # RESTART: where the new attempt's output goes
    deadline: float | None = None  # HOLD: wall-clock time after which the program exits

    def to_json(self) -> bytes:
        return json.dumps({"generation": self.generation, "action": self.action,
                           "env": self.env, "log_path": self.log_path,
                           "deadline": self.deadline}).encode()

    @staticmethod
    def parse(raw: bytes) -> Order | None:
        """The order in ``raw``; None for anything torn or malformed (read again later)."""
        try:
            d = json.loads(raw)
            gen, action = d["generation"], d["action"]
            env = d.get("env") or {}
            deadline = d.get("deadline")
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(gen, int) or action not in (HOLD, RESTART) or not isinstance(env, dict):
            return None
        return Order(gen, action, {str(k): str(v) for k, v in env.items()},
                     str(d.get("log_path") or ""),
                     float(deadline) if isinstance(deadline, (int, float)) else None)


def atomic_write(path: Path, data: bytes) -> None:
    """Readers see the old content or the new, never part of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if os.geteuid() == 0:  # a root adapter writes into a sandboxed job's directory: the
            owner = os.stat(path.parent)  # file is the job's (mkstemp's 0600 is root's alone)
            os.fchown(fd, owner.st_uid, owner.st_gid)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def state_path(control: Path) -> Path:
    return control.with_name(control.name + STATE_SUFFIX)


def read_state(control: Path) -> dict[str, int]:
    """The program's answers (``pid``, ``held``, ``applied``); empty: it never declared."""
    try:
        d = json.loads(state_path(control).read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(d, dict):
        return {}
    return {k: v for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool)}


def read_order(control: Path) -> Order | None:
    try:
        return Order.parse(control.read_bytes())
    except OSError:
        return None


class InProcessRestart:
    """The program's side: declare, poll between steps, hold, wait, apply."""

    def __init__(self, control: Path) -> None:
        self.control = control
        self.generation = 0  # the newest order acted on
        self._stamp: tuple[int, int, int] | None = None
        current = read_order(control)
        if current is not None:  # orders older than this process are not for it
            self.generation = current.generation

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> InProcessRestart | None:
        raw = (os.environ if env is None else env).get(RESTART_FILE, "").strip()
        return cls(Path(raw)) if raw else None

    def declare(self) -> None:
        """This program restarts in process when asked (the adapter then holds it instead of
        SIGTERMing it)."""
        self._answer(held=0, applied=self.generation)

    def poll(self) -> Order | None:
        """A new order, if the control file changed since the last look (else None)."""
        try:
            st = os.stat(self.control)
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return None
        order = read_order(self.control)
        if order is None:
            return None  # torn by a writer that is not atomic: read it next time
        self._stamp = stamp
        return order if order.generation > self.generation else None

    def held(self, order: Order) -> None:
        """The hold is done: the save the program makes before stopping is complete."""
        self.generation = max(self.generation, order.generation)
        self._answer(held=order.generation, applied=self.generation)

    def wait(self, hold: Order, stop: Callable[[], bool], interval_s: float = 0.01
             ) -> Order | None:
        """Wait, held, for the restart; None when ``stop()`` (a SIGTERM) or the hold's
        deadline came first: the program exits as it would have."""
        while not stop():
            order = self.poll()
            if order is not None and order.action == RESTART:
                return order
            if order is not None:  # a newer hold: answer it too
                self.held(order)
                hold = order
            if hold.deadline is not None and time.time() > hold.deadline:
                return None
            time.sleep(interval_s)
        return None

    def standby(self, stop: Callable[[], bool], interval_s: float = 0.01) -> Order | None:
        """A warm standby (``MTC_STANDBY``): imported and declared, wait to be given a rank
        (a ``restart`` order); None when ``stop()`` (a SIGTERM) came first, or when its lease
        ran out: a hold is the lease (its deadline, renewed by the adapter while it wants
        the standby), answered at once; a standby nobody renews (the control plane gone, the
        job over) ends by itself."""
        lease = read_order(self.control)  # the first lease, written before the start
        deadline = lease.deadline if lease is not None and lease.action == HOLD else None
        while not stop():
            order = self.poll()
            if order is not None and order.action == RESTART:
                return order
            if order is not None:
                self.held(order)
                deadline = order.deadline
            if deadline is not None and time.time() > deadline:
                return None
            time.sleep(interval_s)
        return None

    def apply(self, order: Order) -> None:
        """Become the rank of the new attempt: its environment, its log."""
        # the order carries the attempt's whole environment: a restore directive an earlier
        # attempt had and this one has not must not linger
        os.environ.pop(RESTORE_SKIP, None)
        os.environ.update(order.env)
        if order.log_path:
            sys.stdout.flush()
            sys.stderr.flush()
            fd = os.open(order.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.dup2(fd, 1)
                os.dup2(fd, 2)
            finally:
                os.close(fd)
        self.generation = max(self.generation, order.generation)
        self._answer(held=0, applied=order.generation)

    def _answer(self, held: int, applied: int) -> None:
        atomic_write(state_path(self.control),
                     json.dumps({"pid": os.getpid(), "held": held, "applied": applied}).encode())
