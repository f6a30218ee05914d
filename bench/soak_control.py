"""The soak's controller as the runner keeps it: the child process (``bench/soak_controller.py``,
the soak's ``mtc serve``) started, kept running (an exit the soak did not cause is a
violation, and it is started again), stopped, and SIGKILLed by the chaos; the spans it was
down, when nothing read the nodes' faults.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import IO, TYPE_CHECKING

from bench.soak_chaos import TOKEN
from bench.soak_settings import ROOT, SETTINGS

if TYPE_CHECKING:
    from bench.soak import Soak


class ControllerChild:
    """The controller child of one soak (see the module)."""

    def __init__(self, soak: Soak) -> None:
        self.s = soak
        self.proc: subprocess.Popen[bytes] | None = None
        self.down_until: float | None = None  # started again at this time (None: not down)
        self.logs: list[IO[bytes]] = []
        # SIGKILLed until restarted: nothing reports the nodes' faults meanwhile
        self.outages: list[tuple[float, float | None]] = []

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        log = open(self.s.state_dir / f"controller-{self.s.fig.controller_restarts}.log", "ab")  # noqa: SIM115
        self.logs.append(log)
        self.proc = subprocess.Popen(
            self.argv(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env={**os.environ, "MTC_API_TOKEN": TOKEN})

    def argv(self) -> list[str]:
        """The controller is the soak's `mtc serve` (its API on ``teeth.port``)."""
        return [sys.executable, "-m", "bench.soak_controller", "--state-dir",
                str(self.s.state_dir), "--settings", json.dumps(SETTINGS),
                "--port", str(self.s.teeth.port)]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def kill(self, down_s: float) -> bool:
        """SIGKILL, wherever it is (mid-pump, mid-transaction); down for ``down_s``."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return False
        proc.kill()
        proc.wait(timeout=10)
        self.proc = None
        self.down_until = self.s.now() + down_s
        self.outages.append((self.s.now(), None))
        return True

    def keep(self) -> None:
        """An exit by itself is a violation (and an outage); once its time down is over, the
        controller is started again."""
        s = self.s
        if self.proc is not None and self.proc.poll() is not None:
            s.violate(("controller-exit", s.fig.controller_restarts), "controller alive",
                      f"the controller exited by itself with {self.proc.returncode} "
                      f"(log {s.state_dir}/controller-{s.fig.controller_restarts}.log)")
            self.proc = None
            self.down_until = s.now()
            self.outages.append((s.now(), None))
        if self.proc is None and self.down_until is not None and s.now() >= self.down_until:
            s.fig.controller_restarts += 1
            self.start()
            self.down_until = None
            if self.outages and self.outages[-1][1] is None:
                self.outages[-1] = (self.outages[-1][0], s.now())

    def close_logs(self) -> None:
        for log in self.logs:
            log.close()
