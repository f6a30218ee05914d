"""What a job attempt's exit status means to the control plane (pure; no I/O).

Managed training fails a job whose code fails and restarts it on infrastructure
interruptions; the exit status alone cannot tell the two apart, the evidence does. 0 is
success; 75 (EX_TEMPFAIL) means the program saved a checkpoint on SIGTERM and asks to be run
again; 128+N (or a negative code, Python's way of saying "signal N") means signal N ended it.
An attempt ended by the **infrastructure** when:

* the control plane asked it to stop (a drain, an interrupt, a deadline: ``interrupted``),
  whatever its code (a SIGKILL after the grace period included);
* a node under it was lost, taken out of service, reported a fault or went silent around
  the exit (``node_fault``: the caller looks);
* the file system holding the job's files was full when it exited (``storage_full``: the
  compute adapter read it at the exit, ``shared.domain.storage`` decides);
* the platform could not start it (``launch_failed``: the worker launcher's own set-up
  failed before exec, e.g. the sandbox's bind of a directory a repair had just wiped; exit
  126 or 127 with the launcher's word for it). No program ran, so its nodes are not blamed
  either. A command that exec itself refused (missing, not executable) is the job's; or
* it exited 75 (it says it checkpointed on someone's SIGTERM).

Anything else non-zero is the **program's** failure, signals included: 139 (SIGSEGV), 134
(SIGABRT) and the like are raised by the program itself, and a SIGKILL or SIGTERM that
neither the control plane nor a node fault explains (the OOM killer, the program killing
itself) is not an interruption either. The program's failure fails the job unless the spec
asks to restart anyway (``restartJobOnWorkerRestart``). The numbers are the worker
protocol's (``mtc_program.protocol``, the in-job SDK's, which imports nothing); this module
holds only their meaning.
"""

from __future__ import annotations

import enum
import signal

from mtc_program.protocol import GRACEFUL, OK, PREEMPTED, SIGNALLED, ExitCode

__all__ = ["GRACEFUL", "LAUNCH_FAILED", "NEVER_STARTED", "OK", "PREEMPTED", "SIGNALLED",
           "Verdict", "describe", "exit_verdict", "infrastructure_ended", "interrupt_cause",
           "signal_of"]

NEVER_STARTED = frozenset({int(ExitCode.NOT_EXECUTABLE), int(ExitCode.NOT_FOUND)})
LAUNCH_FAILED = "launch_failed"  # the interruption cause (goodput, the restart's reason)


def signal_of(exit_code: int) -> int | None:
    """The signal that ended the attempt (128+N or -N), if one did."""
    if exit_code > SIGNALLED:
        return exit_code - SIGNALLED
    return -exit_code if exit_code < 0 else None


def describe(exit_code: int) -> str:
    """``code 139 (SIGSEGV)``: the code, and the signal it stands for if any."""
    signum = signal_of(exit_code)
    if signum is None:
        return f"code {exit_code}"
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"code {exit_code} ({name})"


def infrastructure_ended(exit_code: int, *, interrupted: bool, node_fault: bool,
                         storage_full: bool = False, launch_failed: bool = False) -> bool:
    """The attempt was ended by the infrastructure, not by the program (see the module):
    each piece of evidence is enough by itself, as is the program's own 75."""
    return interrupted or node_fault or storage_full or launch_failed or exit_code == PREEMPTED


class Verdict(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the program failed on its own
    RESTART = "restart"  # infrastructure (or the spec) says: run it again
    GAVE_UP = "gave_up"  # would restart, but the restart budget is spent
    TIMED_OUT = "timed_out"  # stopped (or would restart) past the job's deadline: it fails


def exit_verdict(exit_code: int, *, interrupted: bool, restart_anyway: bool,
                 restarts: int, max_restarts: int, timed_out: bool = False) -> Verdict:
    """The end of one attempt: finish, fail, or restart it. ``interrupted`` is true when the
    infrastructure ended it (:func:`infrastructure_ended`: the control plane asked the job to
    stop, or a node under it failed); 75 counts as interrupted by itself.

    ``timed_out``: the job's deadline (``scheduling.timeout``) has passed. An attempt the
    control plane stopped then ends TIMED_OUT whatever its code (0 after the SIGTERM
    included), and one that would restart does not; an attempt that finished (0) or failed
    on its own before anyone stopped it keeps that verdict."""
    interrupted = interrupted or exit_code == PREEMPTED
    if exit_code == OK and not interrupted:
        return Verdict.SUCCEEDED
    if not interrupted and not restart_anyway:
        return Verdict.FAILED
    if timed_out:
        return Verdict.TIMED_OUT
    if restarts >= max_restarts:
        return Verdict.GAVE_UP
    return Verdict.RESTART


def interrupt_cause(reason: str) -> str:
    """The cause an interrupt reason names, for the goodput tally: the part before the first
    colon, spaces made underscores (``no_progress: ...`` -> ``no_progress``, the watchdog's
    cause, see ``shared.domain.progress``)."""
    head = (reason or "").split(":", 1)[0].strip()
    return head.replace(" ", "_") or "interrupted"
