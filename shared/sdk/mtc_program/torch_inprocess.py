"""In-process restart for PyTorch programs (the ``torch`` extra): ``InProcess`` wraps a
training function as nvidia-resiliency-ext's in-process wrapper does, on mtc's control file
(``mtc_program.inprocess``).

``InProcess(train).run()`` declares in-process restart where the managed environment offers
it (``MTC_RESTART_FILE``), joins the process group of the attempt (``torch_runtime.Env``)
and calls ``train(call)``. When the attempt ends while the rank is alive (another rank
crashed, the control plane holds the gang for a hot swap or a scale-down), the adapter
writes a ``hold`` order; then:

* the step is dropped: ``call.held()`` turns true (``Checkpointer(held=call.held)`` folds it
  into its per-step agreement, so live ranks stop at the same step and save to the near
  tiers and durable as on SIGTERM), or a collective fails because a peer died (gloo sees
  the closed connection; where a collective stays stuck, as NCCL's do, a monitor thread
  aborts the process group ``abort_after_s`` after an order the loop has not picked up);
* the process group is aborted (``_abort_process_group``: no barrier with the dead);
* the rank answers ``held`` and waits for the next attempt's ``restart`` order, takes its
  environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of the new
  rendezvous, the tier directories, the attempt's log) and joins the new group;
* ``train`` is called again with ``call.iteration`` one higher. The model and optimizer the
  program keeps outside it stay allocated; the function restores the consistent cut, and
  ``call.own`` (``torch_tiers.OwnCopy``: the bytes of this rank's last memory saves) makes
  that restore a load from the process's memory when the ranks agree on that step.

A warm standby (``MTC_STANDBY``: the adapter starts one per node of a job that declared)
runs ``warm()`` (imports done, data loader and model built; a CUDA context where there is a
GPU), does not join any group, and waits to be given a rank.

Without ``MTC_RESTART_FILE`` (Vertex), or under ``torch.distributed.run`` (its agent restarts
its workers), ``run`` joins the group, calls ``train`` once and returns its code.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from mtc_program.inprocess import HOLD, InProcessRestart, Order
from mtc_program.protocol import STANDBY, ExitCode
from mtc_program.signals import Preemption
from mtc_program.torch_runtime import Env
from mtc_program.torch_tiers import OwnCopy

__all__ = ["Call", "Held", "InProcess", "abandon_group"]

EXIT_PREEMPTED = int(ExitCode.PREEMPTED)
TORCHRUN = "TORCHELASTIC_RUN_ID"  # set in every worker torch.distributed.run starts


class Held(Exception):
    """Raised by ``Call.check()`` at a step boundary: the attempt ended, drop the step."""

    def __init__(self, order: Order) -> None:
        super().__init__(f"order {order.generation}: {order.action}")
        self.order = order


class _Monitor:
    """Reads the control file beside the training loop; aborts the process group when an
    order stays unseen by the loop (a collective stuck on a dead peer)."""

    def __init__(self, restart: InProcessRestart, abort_after_s: float,
                 interval_s: float = 0.02) -> None:
        self.restart, self.abort_after_s, self.interval_s = restart, abort_after_s, interval_s
        self.order: Order | None = None
        self.seen = False  # the loop picked the order up (it stops at a step boundary)
        self.aborted = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mtc-inprocess", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        came = 0.0
        while not self._done.wait(self.interval_s):
            with self._lock:
                if self.order is None:
                    self.order = self.restart.poll()
                    came = time.monotonic()
                    continue
                late = time.monotonic() - came > self.abort_after_s
                deadline = self.order.deadline
                # seen, the loop saves; yet not past the hold's deadline, which ends it
                ending = deadline is not None and time.time() > deadline - 1.0
                if (ending or (late and not self.seen)) and not self.aborted:
                    self.aborted = True
                    abandon_group()

    def take(self) -> Order | None:
        with self._lock:
            if self.order is not None:
                self.seen = True
            return self.order

    def stop(self) -> Order | None:
        self._done.set()
        self._thread.join()
        return self.order


@dataclass
class Call:
    """What the training function gets on each call."""

    env: Env  # this attempt's rank, world size, rendezvous, directories
    iteration: int  # 0 on the first call; one more per in-process restart
    own: OwnCopy  # the rank's last memory saves, kept across calls (``TorchTiers(own=)``)
    _monitor: _Monitor | None = field(default=None, repr=False)

    def held(self) -> bool:
        """Whether the attempt ended for this rank (an order came): stop at this step."""
        return self._monitor is not None and self._monitor.take() is not None

    def check(self) -> None:
        """``Held`` if the attempt ended: a loop without ``Checkpointer`` drops its step."""
        order = self._monitor.take() if self._monitor is not None else None
        if order is not None:
            raise Held(order)


def abandon_group() -> None:
    """Leave the process group without a collective (its peers may be dead)."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()  # a DDP reducer that outlives the group holds it (see torch_ddp.py)
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception:  # an older torch, a backend without abort: destroy it instead
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def cuda_context() -> None:
    """Create this process's CUDA context now (seconds on a GPU), not at the first step."""
    if torch.cuda.is_available():
        torch.cuda.set_device(Env.read().local_rank % torch.cuda.device_count())
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()


class InProcess:
    """Run ``train`` and restart it in this process when the attempt ends (see the module).

    ``warm``: the work a warm standby does before it waits (build the data loader and the
    model); it runs once, in the standby only. ``wait_s``: how long a rank whose collective
    failed waits for the order that ends the attempt before it fails as it would have."""

    def __init__(self, train: Callable[[Call], int], *, preemption: Preemption | None = None,
                 warm: Callable[[], None] | None = None,
                 log: Callable[[str], None] | None = None, abort_after_s: float = 5.0,
                 wait_s: float = 30.0) -> None:
        self.train, self.warm = train, warm
        self.preemption = preemption
        self.log = log or (lambda msg: print(f"[inprocess pid {os.getpid()}] {msg}", flush=True))
        self.abort_after_s, self.wait_s = abort_after_s, wait_s
        self.own = OwnCopy()

    def run(self) -> int:
        preemption = self.preemption or Preemption().install()
        # under torch.distributed.run (several processes per node) the node's control file
        # would be shared by its workers, and the agent owns their restarts: run once
        restart = None if os.environ.get(TORCHRUN) else InProcessRestart.from_env()
        if restart is None:
            env = Env.read()
            env.init()
            try:
                return self.train(Call(env, 0, self.own))
            finally:
                abandon_group()
        restart.declare()
        if os.environ.pop(STANDBY, ""):
            if self.warm is not None:
                self.warm()
            cuda_context()
            self.log("standby ready: waiting to be given a rank (no process group joined)")
            given = restart.standby(lambda: preemption.requested)
            if given is None:
                return EXIT_PREEMPTED
            restart.apply(given)
        iteration = 0
        while True:
            ended = self._attempt(restart, preemption, iteration)
            if isinstance(ended, int):
                return ended
            order: Order | None = ended
            if ended.action == HOLD:
                restart.held(ended)
                self.log(f"held (order {ended.generation}): waiting for the next attempt")
                order = restart.wait(ended, lambda: preemption.requested)
            if order is None:
                return EXIT_PREEMPTED
            restart.apply(order)
            iteration += 1
            self.log(f"restarting in process (order {order.generation}, call {iteration})")

    def _attempt(self, restart: InProcessRestart, preemption: Preemption, iteration: int
                 ) -> int | Order:
        """One call of ``train`` in the attempt's group: its exit code, or the order that
        ended the attempt (the group abandoned)."""
        env = Env.read()
        env.init()  # this attempt's rendezvous (a new MASTER_PORT per attempt)
        monitor = _Monitor(restart, self.abort_after_s)
        try:
            result = self.train(Call(env, iteration, self.own, monitor))
        except Exception as exc:
            order = monitor.stop()
            if order is None and not preemption.requested:
                # a peer failed first: the order that ends the attempt follows
                self.log(f"the step failed ({type(exc).__name__}: {str(exc)[:200]}): "
                         "waiting for the attempt's end")
                order = self._await(restart, preemption)
            if order is None or preemption.requested:
                abandon_group()
                raise
            self.log(f"step dropped ({type(exc).__name__}): the attempt ended")
        else:
            order = monitor.stop()
            if result == EXIT_PREEMPTED and order is None and not preemption.requested:
                order = self._await(restart, preemption)  # stopped with a held peer: ours follows
            if result != EXIT_PREEMPTED or order is None or preemption.requested:
                abandon_group()
                return result
        # out of the handler: the traceback's frames (a DDP wrapper in them) are gone
        abandon_group()
        return order

    def _await(self, restart: InProcessRestart, preemption: Preemption) -> Order | None:
        deadline = time.monotonic() + self.wait_s
        while not preemption.requested and time.monotonic() < deadline:
            if (order := restart.poll()) is not None:
                return order
            time.sleep(0.01)
        return None
