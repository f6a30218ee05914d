"""What a job attempt's exit status means to the control plane (pure; no I/O).

Managed training's convention: 0 is success; 75 (EX_TEMPFAIL) means the program saved a
checkpoint on SIGTERM and asks to be run again; 128+N (or a negative code, Python's way of
saying "signal N") means something outside the program killed it (the OOM killer, a lost
host, preemption). Anything else is the program failing on its own, which fails the job
unless the spec asks to restart anyway. The compute package's ``ExitCode`` enum
(``shared/adapters/compute/protocol.py``) names the same numbers for the adapters; this module
holds only their meaning, so the domain imports nothing from the adapters.
"""

from __future__ import annotations

import enum

OK = 0
PREEMPTED = 75  # EX_TEMPFAIL
SIGNALLED = 128  # + N: killed by signal N


def killed_from_outside(exit_code: int) -> bool:
    """Preempted, or killed by a signal: not the program's bug."""
    return exit_code == PREEMPTED or exit_code >= SIGNALLED or exit_code < 0


class Verdict(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the program failed on its own
    RESTART = "restart"  # infrastructure (or the spec) says: run it again
    GAVE_UP = "gave_up"  # would restart, but the restart budget is spent
    TIMED_OUT = "timed_out"  # stopped (or would restart) past the job's deadline: it fails


def exit_verdict(exit_code: int, *, interrupted: bool, restart_anyway: bool,
                 restarts: int, max_restarts: int, timed_out: bool = False) -> Verdict:
    """The end of one attempt: finish, fail, or restart it. ``interrupted`` is true when the
    control plane asked the job to stop, a signal killed it, or it lost a node.

    ``timed_out``: the job's deadline (``scheduling.timeout``) has passed. An attempt the
    control plane stopped then ends TIMED_OUT whatever its code (0 after the SIGTERM
    included), and one that would restart does not; an attempt that finished (0) or failed
    on its own before anyone stopped it keeps that verdict."""
    interrupted = interrupted or killed_from_outside(exit_code)
    if exit_code == OK and not interrupted:
        return Verdict.SUCCEEDED
    if not interrupted and not restart_anyway:
        return Verdict.FAILED
    if timed_out:
        return Verdict.TIMED_OUT
    if restarts >= max_restarts:
        return Verdict.GAVE_UP
    return Verdict.RESTART
