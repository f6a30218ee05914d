"""Restarts that cannot loop: the escalation ladder's bookkeeping on the job.

Each restart of a job whose attempt ended without progress is remembered with the mode that
started that attempt, its rung, how it ended and what its ranks restored
(``JobRecovery.stalled``); ``shared.policies.escalation`` reads the rungs and says where
the next restart stands: the modes the recovery policy may not choose (``modes.recover``)
and the tiers the restore must skip (``JobRecovery.restore_skip``, given to the program as
``MTC_RESTORE_SKIP`` by ``shared.service_layer.gangs``), or, with every rung spent, that
the job fails with what each of those attempts did as the evidence.

Idempotent under redelivery: it runs inside the handling of an attempt's one
``JobWorkersExited``, which a stale or repeated delivery never reaches.
"""

from __future__ import annotations

from typing import Any

from shared.domain.model import Job
from shared.handling import Deps
from shared.policies import escalation
from shared.policies.escalation import Step

EXIT_CHARS = 300  # of an attempt's exit detail, kept as evidence


def after_attempt(job: Job, progressed: bool, how_it_ended: str, deps: Deps) -> Step:
    """Count the ended attempt on the ladder (or start again after progress) and say
    where the next restart stands."""
    rec = job.recovery
    config = deps.config.ladder
    if progressed:
        rec.stalled = []
    else:
        rung = escalation.rung_of(_rungs(rec.stalled), config)
        if rung is not None:  # (spent: a job without near tiers stays on the last rung)
            rec.stalled.append({"attempt": job.attempt, "mode": rec.attempt_mode or "requeue",
                                "rung": rung, "exit": how_it_ended[:EXIT_CHARS],
                                "restore": rec.restore_of(job.attempt)})
    step = escalation.next_step(_rungs(rec.stalled), config, near=bool(rec.tiers))
    rec.restore_skip = [t.value for t in step.skip]
    return step


def _rungs(stalled: list[dict[str, Any]]) -> list[int]:
    return [int(s.get("rung", 0)) for s in stalled]


def evidence(job: Job, step: Step) -> str:
    """Why the job fails: the ladder spent, and what each attempt without progress did."""
    parts = []
    for s in job.recovery.stalled:
        rung = escalation.RUNGS[int(s.get("rung", 0))]
        skipped = f", {' and '.join(t.value for t in rung.skip)} skipped" if rung.skip else ""
        parts.append(f"attempt {s['attempt']} ({s['mode']}{skipped}, {_restore(s.get('restore'))})"
                     f": {s['exit']}")
    return f"{step.why}: " + "; ".join(parts)


def _restore(record: dict[str, Any] | None) -> str:
    if not record:
        return "restore not reported"
    if int(record.get("step", -1)) < 0:
        what = "restored nothing"
    else:
        what = f"restored step {record['step']} from {'+'.join(record.get('tiers') or ['?'])}"
    failed = record.get("failed") or []
    return what + (f" after {'; '.join(failed)}" if failed else "")
