"""Run one worker and leave its exit code in a file.

    python -m shared.adapters.compute.worker_launcher --exit-file PATH -- CMD [ARG...]

Workers outlive the CLI process that started them, so nobody is left to ``wait()`` for them:
this launcher is the parent that waits. It starts CMD, relays SIGTERM/SIGINT, and when CMD
ends writes its exit code (decimal, one line) to PATH atomically (temp file + ``os.replace``)
and exits with the same code. A child killed by signal N is reported as 128+N (137 for
SIGKILL, 143 for SIGTERM), as shells do; a command that cannot be started is 127 (not found)
or 126 (not executable). No exit file means the launcher itself was killed. These are the
worker protocol's codes (``protocol.ExitCode``), restated here because this file imports nothing.

Signals: when the launcher leads its own process group (LocalCompute starts it with
``start_new_session=True``), a SIGTERM/SIGINT sent to the launcher is relayed once to the
whole group, so CMD and anything CMD started get it exactly once. Signal the launcher's pid,
not the group: a group signal would reach CMD twice (directly and relayed). When the launcher
does not lead its group (started from a shell), only CMD is signalled.

No orphans: on Linux CMD is started with ``PR_SET_PDEATHSIG`` = SIGKILL, so if the launcher
itself is killed (SIGKILL cannot be relayed) CMD dies with it instead of training on alone,
unobserved; whatever CMD started in the group is killed by the adapter when it finds the
launcher gone without an exit file (``local_procs.exit_code``).

Standard library only, so it runs by file path with any Python, without the package.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from types import FrameType

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
RELAYED = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _pdeathsig_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` (run in the child before exec) that makes the kernel SIGKILL the child
    when the launcher dies; None where there is no prctl (not Linux: the adapter's group kill
    is what is left). libc is loaded here, in the parent: the hook itself only calls it. If the
    launcher died before the call took effect, the child goes at once."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def write_exit_file(path: str, code: int) -> None:
    """Atomically leave ``code`` in ``path``: readers see no file or the whole number."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".exit.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{code}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def exit_code_of(returncode: int) -> int:
    """Popen's returncode (negative for a signal) as a shell-style exit code."""
    return 128 - returncode if returncode < 0 else returncode


class _Relay:
    """Forwards SIGTERM/SIGINT to the child, or to the whole group when we lead it.

    A signal that arrives before the child exists is remembered and sent once it does."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []
        self.leads_group = os.getpgrp() == os.getpid()
        self.asked_to_stop = False

    def install(self) -> None:
        for sig in RELAYED:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.asked_to_stop = True
        if self.child is None:
            self.pending.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        assert self.child is not None
        if self.child.poll() is not None:
            return
        if self.leads_group:
            # Ignore it ourselves while it goes to the group, then handle it again.
            signal.signal(signum, signal.SIG_IGN)
            try:
                os.killpg(os.getpgrp(), signum)
            finally:
                signal.signal(signum, self._handle)
        else:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        for signum in self.pending:
            self._send(signum)
        self.pending.clear()


def run(exit_file: str, command: Sequence[str], *, zero_after_stop: bool = False) -> int:
    """Run ``command``; its exit code goes to ``exit_file`` and is returned. With
    ``zero_after_stop``, a command that was asked to stop (SIGTERM/SIGINT) returns 0 here
    whatever its code (the file keeps the real one): under ``srun --kill-on-bad-exit`` a
    rank that checkpointed and left quickly must not kill the ranks still saving theirs,
    while a rank that fails on its own still ends the gang."""
    relay = _Relay()
    relay.install()  # before the child exists: a signal during start-up is kept, not lost
    try:
        env = {**os.environ, "MTC_TERMINATION_LOG": f"{exit_file}.msg"}  # why it failed
        with contextlib.suppress(OSError):
            os.unlink(f"{exit_file}.msg")
        child = subprocess.Popen(list(command), preexec_fn=_pdeathsig_hook(), env=env)
    except FileNotFoundError as exc:
        print(f"worker_launcher: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        code = EXIT_NOT_FOUND
    except OSError as exc:
        print(f"worker_launcher: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        code = EXIT_NOT_EXECUTABLE
    else:
        relay.started(child)
        code = exit_code_of(child.wait())
    sys.stderr.flush()
    write_exit_file(exit_file, code)
    return 0 if zero_after_stop and relay.asked_to_stop else code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="worker_launcher", description="Run CMD, relay signals, record its exit code."
    )
    parser.add_argument("--exit-file", required=True, help="where to write the exit code")
    parser.add_argument("--zero-after-stop", action="store_true",
                        help="exit 0 once asked to stop (the exit file keeps the real code)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given after --")
    return run(args.exit_file, command, zero_after_stop=args.zero_after_stop)


if __name__ == "__main__":
    sys.exit(main())
