"""Step traces written twice: as mtc's event log and as the public calculator's log entries.

A trace is one training job, its attempts and its faults, played step by step with exact
times: each attempt starts, spends ``startup`` (and ``restore`` when it resumes), then runs
steps of ``step_s``; after every ``every``-th step it blocks ``save_s`` writing a checkpoint.
A fault stops it at a given time (in a step or in a save: the save then never completes), is
detected ``detect_s`` later, the workers exit ``exit_s`` after that, the job is requeued and
starts again on another node after ``wait_s``. The job finishes after ``steps`` steps.

``rows`` is what mtc logs (the event types and fields of ``shared.domain.events``); ``entries``
is what ml-goodput-measurement's ``GoodputRecorder`` and Orbax's checkpoint logger write to
Cloud Logging for the same run (job start per attempt, training preparation, every step's start,
checkpoint saves and restores, job end), and ``truth`` the seconds each thing took.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

T0 = 1_800_000_000.0
JOB = "trace-job"


@dataclass(frozen=True)
class Fault:
    after_s: float  # into the attempt, counted from its start
    detect_s: float = 5.0
    exit_s: float = 30.0
    wait_s: float = 60.0  # requeued to started again (waiting for a spare)
    cause: str = "faulty_gpu"


@dataclass(frozen=True)
class Trace:
    steps: int
    step_s: float = 10.0
    every: int = 10
    save_s: float = 20.0
    restore_s: float = 60.0
    startup_s: tuple[float, ...] = (120.0,)  # per attempt; the last repeats
    faults: tuple[Fault, ...] = ()


@dataclass
class Played:
    rows: list[dict[str, Any]] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    truth: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    end: float = T0

    def row(self, t: float, type_: str, **data: Any) -> None:
        self.rows.append({"type": type_, "time": t, "data": {"job_id": JOB, **data}
                          if type_.startswith("mtc.job.") else data})


def play(trace: Trace) -> Played:
    out = Played()
    t, ckpt, attempt = T0, 0, 1
    out.row(t, "mtc.job.submitted.v1", cluster_id="c1")
    faults = list(trace.faults)
    while True:
        node = f"n{attempt}"
        start = t
        out.row(t, "mtc.job.started.v1", attempt=attempt, node_ids=[node],
                resume_step=ckpt if attempt > 1 else -1)
        out.entries.append({"job_start_time": t})
        startup = trace.startup_s[min(attempt - 1, len(trace.startup_s) - 1)]
        out.entries.append({"training_prep_start_time": t})
        out.entries.append({"training_prep_end_time": t + startup})
        t += startup
        out.truth["startup"] += startup
        if ckpt > 0:
            out.entries.append({"event_type": "restore", "step": ckpt, "directory": "gs://b/c",
                                "checkpoint_manager_duration_secs": trace.restore_s,
                                "checkpointer_duration_secs": trace.restore_s})
            t += trace.restore_s
            out.truth["restore"] += trace.restore_s
        fault_at = start + faults[0].after_s if faults else None
        step = ckpt
        stopped = False
        while step < trace.steps:
            if fault_at is not None and t >= fault_at:
                stopped = True
                break
            out.entries.append({"step_count": step + 1, "step_start_time": t})
            end = t + trace.step_s
            if fault_at is not None and fault_at < end:
                stopped = True
                break
            t, step = end, step + 1
            if step % trace.every == 0 or step == trace.steps:
                if fault_at is not None and fault_at < t + trace.save_s:
                    stopped = True  # the fault hits the save: it never completes
                    break
                t += trace.save_s
                out.truth["save"] += trace.save_s
                out.row(t, "mtc.job.checkpoint_saved.v1", attempt=attempt, step=step,
                        path=f"ckpt-{step}", saved_at=t, save_s=trace.save_s)
                out.entries.append({"event_type": "save", "step": step, "directory": "gs://b/c",
                                    "checkpoint_manager_blocking_duration_secs": trace.save_s,
                                    "checkpointer_blocking_duration_secs": trace.save_s,
                                    "wait_for_prev_duration_secs": 0.0,
                                    "get_old_steps_duration_secs": 0.0})
                ckpt = step
        if not stopped:
            out.row(t, "mtc.job.workers_exited.v1", attempt=attempt, exit_code=0, detail="")
            out.row(t, "mtc.job.finished.v1", cluster_id="c1", state="JOB_STATE_SUCCEEDED")
            out.entries.append({"job_end_time": t})
            out.end = t
            return out
        assert fault_at is not None
        fault = faults.pop(0)
        t = fault_at
        seen = t + fault.detect_s
        out.row(seen, "mtc.node.health_reported.v1", node_id=node, observed_at=seen,
                conditions=[{"type": "XidError", "status": "true", "reason": "xid 79",
                             "since": t, "details": {"xids": [79], "cause": fault.cause}}])
        out.row(seen, "mtc.node.diagnosed.v1", node_id=node, observed_at=seen,
                failure_mode="gpu_fell_off_bus", severity="fatal", action="reboot")
        exited = seen + fault.exit_s
        out.row(exited, "mtc.job.workers_exited.v1", attempt=attempt, exit_code=1,
                detail="rank 0 exited 1")
        out.row(exited, "mtc.job.requeued.v1", cluster_id="c1", restart_count=attempt,
                reason="gpu_fell_off_bus")
        t = exited + fault.wait_s
        attempt += 1
