"""No fact lost on the cloud path: a job's ``workers_exited`` that Pub/Sub dead-letters (the
checkpoint-resume function fails on every delivery until the retry budget is spent) is
re-announced by the executor's reconciler, and the job ends by itself, no operator
replaying the dead-letter subscription."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gcp_support import PROJECT, wait_for
from test_gcp_delivery import SETTINGS, Gcp, gcp  # noqa: F401  (the emulator stack's fixture)

import services.wiring.runtime as rt_mod
from services.executor.announced import AnnouncedRecord, Recording
from services.executor.dedup import DedupRecord
from services.executor.executor import Executor
from services.executor.reconcile import Reconciler, StoreJobViews
from services.job_submission import commands as job_commands
from shared.adapters import pubsub as ps
from shared.adapters.compute.remote.bus import MemoryRequestBus
from shared.adapters.outbox import SourceEmitter
from shared.codec import from_pubsub_message
from shared.domain.events import Envelope, JobWorkersExited
from shared.domain.model import JobState
from shared.handling import Outcome
from shared.policies.reconcile import Limits
from tests.harness import job_body

pytestmark = pytest.mark.integration

EXITED = JobWorkersExited.TYPE


def test_a_dead_lettered_exit_is_reconciled_and_the_job_ends(
        gcp: Gcp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    gcp.plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    gcp.plane.deliver()
    assert gcp.plane.job("j1").state is JobState.RUNNING

    # checkpoint-resume fails on every delivery of the exit while ``broken`` holds
    broken = [True]
    spy = rt_mod.run_handler

    def failing(service: str, handler: Any, envelope: Envelope, deps: Any) -> Outcome:
        if broken[0] and service == "checkpoint_resume" and envelope.type == EXITED:
            # through the spy, so the test sees each failed delivery
            return spy(service, _raise, envelope, deps)
        return spy(service, handler, envelope, deps)

    monkeypatch.setattr("services.wiring.runtime.run_handler", failing)

    # the executor's side: its results published through its record of them
    record = AnnouncedRecord(tmp_path / "executor")
    emit = SourceEmitter(Recording(gcp.runtime.publisher.publish, record), gcp.clock,
                         "//mtc/compute/local")
    emit(JobWorkersExited(job_id="j1", attempt=1, exit_code=0))

    path = f"projects/{PROJECT}/subscriptions/{ps.dead_letter_subscription_id(gcp.prefix)}"
    dead: list[Any] = []

    def dead_lettered() -> bool:
        dead.extend(m for m in ps.pull(path, timeout_s=2)
                    if m.attributes.get("ce-type") == EXITED
                    and m.attributes.get("mtc-service") != "executor")
        return bool(dead)

    wait_for(dead_lettered, timeout_s=60, what="the exit in the dead-letter topic")
    lost = from_pubsub_message({"attributes": dict(dead[0].attributes), "data": dead[0].data})
    failed = gcp.outcomes_of("checkpoint_resume", lost)
    assert len(failed) == SETTINGS.max_delivery_attempts
    assert all(o.startswith("raised") for o in failed)
    broken[0] = False  # the function is healthy again; Pub/Sub will not try once more
    assert gcp.plane.job("j1").state is JobState.RUNNING  # no workers, nobody to say so

    limits = Limits(settle_s=60.0)
    executor = Executor(
        MemoryRequestBus(), gcp.compute, DedupRecord(tmp_path / "dedup"), gcp.clock,
        reconciler=Reconciler(record, StoreJobViews(gcp.store), gcp.runtime.publisher.publish,
                              gcp.clock, limits, every_s=30.0))
    try:
        gcp.clock.advance(limits.settle_s)
        executor.step(timeout_s=0)  # its reconciler's pass: the exit is re-announced
        wait_for(lambda: gcp.plane.job("j1").state is JobState.SUCCEEDED, timeout_s=30,
                 what="the job's end from the re-announced exit")
        # the same CloudEvent as the one dead-lettered, handled once (its outcome is noted
        # after the handler's commit, which the job's state shows first)
        wait_for(lambda: len(gcp.outcomes_of("checkpoint_resume", lost)) > len(failed),
                 timeout_s=10, what="the re-announced exit's outcome")
        assert gcp.outcomes_of("checkpoint_resume", lost)[len(failed):] == ["handled"]
        gcp.clock.advance(limits.max_gap_s)
        executor.step(timeout_s=0)  # the store has it: the record dropped, nothing re-sent
        assert len(record) == 0
    finally:
        executor.dedup.close()
        record.close()


def _raise(event: Any, uow: Any, deps: Any) -> None:
    raise RuntimeError("checkpoint_resume is down")
