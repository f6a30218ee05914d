"""The executor's reconciler over the real handlers: an exit the bus lost is re-announced
with its original identity and ends the job; a copy the store had is dropped by the
handlers' idempotency; what the store recorded is forgotten; the executor's loop runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.checkpoint_resume.handlers import SERVICE
from services.checkpoint_resume.measure import on_first_step
from services.executor.announced import AnnouncedRecord, Recording
from services.executor.dedup import DedupRecord
from services.executor.executor import Executor
from services.executor.reconcile import Reconciler, StoreJobViews
from services.job_submission import commands as job_commands
from shared.adapters.compute.remote.bus import MemoryRequestBus
from shared.adapters.outbox import SourceEmitter
from shared.domain.events import Envelope, JobCheckpointSaved, JobFirstStep, JobWorkersExited
from shared.domain.model import JobState
from shared.handling import Outcome, run_handler
from shared.policies.reconcile import Limits
from tests.harness import Plane, job_body

LIMITS = Limits(settle_s=60.0, max_gap_s=600.0)


class Story:
    """A plane with job j1 RUNNING at attempt 1, and an executor-side emitter whose
    publishes are recorded and then lost (``lose``) or delivered."""

    def __init__(self, tmp_path: Path) -> None:
        self.plane = Plane().up()
        self.plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
        self.plane.deliver()
        assert self.plane.job("j1").state is JobState.RUNNING
        self.lose = True
        self.lost: list[Envelope] = []
        self.record = AnnouncedRecord(tmp_path)
        self.emit = SourceEmitter(Recording(self._bus, self.record), self.plane.clock,
                                  "//mtc/compute/local")
        self.reconciler = Reconciler(self.record, StoreJobViews(self.plane.store), self.resend,
                                     self.plane.clock, LIMITS, every_s=30.0)
        self.resent: list[Envelope] = []

    def _bus(self, envelope: Envelope) -> None:
        if self.lose:
            self.lost.append(envelope)  # dead-lettered: the store never hears of it
        else:
            self.plane.bus.inject(envelope)

    def resend(self, envelope: Envelope) -> None:
        self.resent.append(envelope)
        self.plane.bus.inject(envelope)


@pytest.fixture
def story(tmp_path: Path) -> Story:
    return Story(tmp_path)


def test_a_lost_exit_is_re_announced_with_its_identity_and_ends_the_job(story: Story) -> None:
    story.emit(JobWorkersExited(job_id="j1", attempt=1, exit_code=0))
    story.emit(JobCheckpointSaved("j1", 1, 10, "/ckpt/10", story.plane.clock.now()))
    story.plane.deliver()
    assert len(story.record) == 1  # only the attempt facts are kept
    assert story.plane.job("j1").state is JobState.RUNNING
    assert story.reconciler.run_once().resend == ()  # the bus has settle_s first
    story.plane.clock.advance(LIMITS.settle_s)
    decided = story.reconciler.run_once()
    assert [f.kind for f in decided.resend] == [JobWorkersExited.TYPE]
    [resent] = story.resent
    [lost] = [e for e in story.lost if isinstance(e.event, JobWorkersExited)]
    assert (resent.id, resent.source, resent.time) == (lost.id, lost.source, lost.time)
    story.plane.deliver()
    assert story.plane.job("j1").state is JobState.SUCCEEDED
    story.plane.clock.advance(LIMITS.max_gap_s)
    assert [f.event_id for f in story.reconciler.run_once().settled] == [lost.id]
    assert len(story.record) == 0 and len(story.resent) == 1


def test_a_copy_the_store_had_is_a_duplicate_and_an_exit_it_recorded_is_never_sent(
        story: Story) -> None:
    story.emit(JobFirstStep(job_id="j1", attempt=1, step=1))
    story.plane.clock.advance(LIMITS.settle_s)
    story.reconciler.run_once()
    [first_step] = story.resent
    story.plane.deliver()
    assert story.plane.job("j1").recovery.startup["cold_attempt"] == 1
    [lost] = story.lost  # the original, replayed by an operator after all: the same event
    assert run_handler(SERVICE, on_first_step, lost, story.plane.deps) is Outcome.DUPLICATE
    story.lose = False
    story.emit(JobWorkersExited(job_id="j1", attempt=1, exit_code=1, detail="crash"))
    story.plane.deliver()
    assert story.plane.job("j1").state is JobState.FAILED
    story.plane.clock.advance(LIMITS.max_gap_s)
    decided = story.reconciler.run_once()
    assert decided.resend == () and len(decided.settled) == 2 and len(story.record) == 0
    assert story.resent == [first_step]


def test_the_executor_loop_runs_a_pass_at_most_every_every_s(story: Story,
                                                            tmp_path: Path) -> None:
    story.emit(JobWorkersExited(job_id="j1", attempt=1, exit_code=0))
    executor = Executor(MemoryRequestBus(), story.plane.compute, DedupRecord(tmp_path / "d"),
                        story.plane.clock, reconciler=story.reconciler)
    story.plane.clock.advance(LIMITS.settle_s - 1)
    executor.step(timeout_s=0)  # a pass, too early for the exit
    story.plane.clock.advance(1)
    executor.step(timeout_s=0)  # not due: the last pass was a second ago
    assert story.resent == []
    story.plane.clock.advance(30)
    executor.step(timeout_s=0)
    assert len(story.resent) == 1
    executor.dedup.close()


def test_the_announced_record_keeps_its_newest_facts_within_its_bound(tmp_path: Path) -> None:
    """Everything that grows has a bound: past ``max_records`` the oldest facts go first,
    and what survives a reopen is what was kept (the file is the record)."""
    record = AnnouncedRecord(tmp_path, max_records=2)
    for attempt in (1, 2, 3):
        env = Envelope(JobWorkersExited(job_id="j1", attempt=attempt, exit_code=1),
                       f"e{attempt}", "//mtc/compute/local", float(attempt))
        assert record.note(env)
    assert len(record) == 3  # bounded when facts are settled, not on every note
    assert record.forget([]) == 0
    record.close()
    reopened = AnnouncedRecord(tmp_path, max_records=2)
    assert [f.attempt for f in reopened.facts(before=10.0, limit=10)] == [2, 3]
    assert reopened.envelope("e3") is not None and reopened.envelope("e1") is None
    reopened.close()
