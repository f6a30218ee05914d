"""A refused call the control plane waits on is answered as not done, once, so nothing waits
for ever: the job is requeued, the repair planned again, the deep checks judged unknown."""

from __future__ import annotations

from pathlib import Path

from services.executor.answers import CAUSE, refusal_answer
from services.executor.dedup import DedupRecord
from services.executor.executor import APPLIED, DUPLICATE, REFUSED, RETRY, Executor
from services.job_submission import commands as job_commands
from shared.adapters.compute.remote.bus import MemoryRequestBus
from shared.adapters.compute.remote.codec import decode
from shared.adapters.compute.remote.compute import RemoteCompute
from shared.domain.events import (
    Event,
    JobWorkersExited,
    NodeHealthReported,
    NodeRepairCompleted,
)
from shared.domain.health import RepairAction
from shared.domain.model import JobState
from shared.policies.repair import DEEP_CHECK_SOURCE
from tests.harness import ManualClock, Plane, Recorder, job_body, one_pool_gang
from tests.unit.executor.test_executor import CallLog

TTL_S = 60.0


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.clock = ManualClock(1000.0)
        self.bus = MemoryRequestBus()
        self.compute = RemoteCompute(self.bus, self.clock, ttl_s=TTL_S)
        self.machines = CallLog()
        self.answers = Recorder()
        self.executor = Executor(self.bus, self.machines, DedupRecord(tmp / "ex"),  # type: ignore[arg-type]
                                 self.clock, report=self.answers)

    def drain(self) -> list[str]:
        outcomes = []
        while deliveries := self.bus.receive(10, 0.0):
            outcomes += [self.executor.handle(d) for d in deliveries]
        return outcomes


def test_a_start_refused_past_its_deadline_ends_the_attempt_to_be_run_again(tmp_path: Path
                                                                           ) -> None:
    rig = Rig(tmp_path)
    rig.compute.start_workers(one_pool_gang("j1", 3, ["n1", "n2"], ["python", "train.py"], out="/tmp/out"))
    rig.clock.advance(TTL_S + 5)  # the executor was away
    assert rig.drain() == [REFUSED]
    assert rig.machines.calls == []
    [exited] = rig.answers.of(JobWorkersExited)
    assert (exited.job_id, exited.attempt, exited.exit_code) == ("j1", 3, 75)
    assert f"cause={CAUSE}" in exited.detail and "past its deadline by 5.0 s" in exited.detail


def test_a_refused_repair_fails_and_a_refused_deep_check_is_unknown(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.compute.start_repair("n1", RepairAction.REBOOT, 2)
    rig.compute.start_deep_check("n2", 1)  # type: ignore[attr-defined]
    rig.compute.cordon("n3", "xid 79")  # nothing waits on a cordon's result
    rig.clock.advance(TTL_S + 1)
    assert rig.drain() == [REFUSED, REFUSED, REFUSED]
    [repair] = rig.answers.of(NodeRepairCompleted)
    assert (repair.node_id, repair.action, repair.attempt, repair.ok) == ("n1", "reboot", 2,
                                                                         False)
    [checks] = rig.answers.of(NodeHealthReported)
    assert checks.node_id == "n2" and checks.source == DEEP_CHECK_SOURCE
    assert {c["status"] for c in checks.conditions} == {"unknown"}
    assert {c["details"]["deep_check_attempt"] for c in checks.conditions} == {1}
    assert len(rig.answers.events) == 2


def test_the_answer_is_sent_once_and_before_the_refusal_is_recorded(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.compute.start_workers(one_pool_gang("j1", 1, ["n1"], ["python", "train.py"], out="/tmp/out"))
    rig.clock.advance(TTL_S + 1)
    [delivery] = rig.bus.receive(10, 0.0)
    sent = rig.answers

    def unreachable(event: Event) -> None:
        raise OSError("the event topic did not answer")

    rig.executor.report = unreachable
    assert rig.executor.handle(delivery) == RETRY  # nacked: nothing recorded
    assert rig.executor.dedup.seen(decode(delivery.data, delivery.attributes,
                                          delivery.ordering_key).request_id) is None
    rig.executor.report = sent
    assert rig.drain() == [REFUSED]  # it came back: answered now, then recorded
    assert len(sent.of(JobWorkersExited)) == 1
    rig.bus.put(delivery.data, delivery.attributes, delivery.ordering_key)  # a redelivery
    assert rig.drain() == [DUPLICATE]
    assert len(sent.of(JobWorkersExited)) == 1


def test_a_request_in_time_is_applied_and_answered_by_the_machines_alone(tmp_path: Path
                                                                         ) -> None:
    rig = Rig(tmp_path)
    rig.compute.start_repair("n1", RepairAction.REBOOT, 1)
    assert rig.drain() == [APPLIED]
    assert rig.answers.events == []


def test_unreadable_arguments_get_no_answer() -> None:
    from shared.adapters.compute.remote.codec import ComputeRequest

    for op, args in (("start_workers", {"gang": {"job_id": 7}}),
                     ("start_repair", {"node_id": "n1"}),
                     ("start_deep_check", {"node_id": "n1", "attempt": "one"})):
        bad = ComputeRequest(op, args, "r1", "n1", 1000.0, 1000.0 + TTL_S)
        assert refusal_answer(bad, "late", 1100.0) is None, op


def test_the_control_plane_requeues_the_job_whose_start_was_refused() -> None:
    """The answer through the real handlers: attempt 1 never ran, attempt 2 starts."""
    plane = Plane().up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    assert plane.job("j1").attempt == 1
    start = one_pool_gang("j1", 1, plane.job("j1").node_ids, ["python", "train.py"],
                          out="/tmp/out")
    from shared.adapters.compute.remote.codec import gang_args, make_request

    refused = make_request("start_workers", gang_args(start), plane.clock.now(), TTL_S)
    answer = refusal_answer(refused, "refused by the executor, past its deadline by 9.0 s",
                            plane.clock.now())
    assert answer is not None
    plane.inject(answer)
    plane.deliver()
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2 and job.restart_count == 1
