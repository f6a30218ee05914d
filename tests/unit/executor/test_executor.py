"""The compute executor: once per request id, refused past its deadline, in order per key,
safe under redelivery, duplicates and a restart mid-stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.executor import placements
from services.executor.dedup import DedupRecord
from services.executor.executor import (
    APPLIED,
    DUPLICATE,
    EXECUTORS,
    HELD,
    MALFORMED,
    REFUSED,
    RETRY,
    SUPERSEDED,
    Executor,
    LoggedRefusals,
)
from services.executor.placements import Placed
from services.observability import alerts
from shared.adapters.compute.remote.bus import Delivery, MemoryRequestBus
from shared.adapters.compute.remote.codec import decode, encode, gang_args, make_request
from shared.adapters.compute.remote.compute import RemoteCompute
from shared.adapters.memory_store import MemoryDocStore
from shared.domain.health import RepairAction
from shared.ports import Gang, LaunchGroup
from tests.contract.compute_drivers import make_node
from tests.harness import ManualClock


@dataclass
class CallLog:
    """A Compute that records each call; ``fail`` makes the next N calls raise."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    fail: int = 0

    def _call(self, *call: Any) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("slurmctld did not answer")
        self.calls.append(call)

    def provision_node(self, node: Any) -> None:
        self._call("provision", node.node_id)

    def cordon(self, node_id: str, reason: str) -> None:
        self._call("cordon", node_id, reason)

    def uncordon(self, node_id: str) -> None:
        self._call("uncordon", node_id)

    def delete_node(self, node_id: str) -> None:
        self._call("delete", node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        self._call("repair", node_id, action, attempt)

    def start_workers(self, gang: Gang) -> None:
        self._call("start", gang)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        self._call("signal", job_id, attempt, grace_s)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self._call("stop", job_id, attempt)


@dataclass
class Rig:
    tmp: Path
    clock: ManualClock = field(default_factory=lambda: ManualClock(1000.0))
    bus: MemoryRequestBus = field(default_factory=MemoryRequestBus)
    machines: CallLog = field(default_factory=CallLog)
    refusals: LoggedRefusals = field(default_factory=LoggedRefusals)
    liveness: MemoryDocStore = field(default_factory=MemoryDocStore)
    executor: Executor = field(init=False)

    def __post_init__(self) -> None:
        self.compute = RemoteCompute(self.bus, self.clock, ttl_s=60.0)
        self.executor = self.restart()

    def restart(self) -> Executor:
        """A new executor process over the same state directory."""
        self.executor = Executor(self.bus, self.machines, DedupRecord(self.tmp / "ex"),  # type: ignore[arg-type]
                                 self.clock, refusals=self.refusals, liveness=self.liveness,
                                 executor_id="ex-1", kind="test", heartbeat_s=5.0)
        return self.executor

    def drain(self) -> list[str]:
        outcomes = []
        while deliveries := self.bus.receive(10, 0.0):
            outcomes += [self.executor.handle(d) for d in deliveries]
        return outcomes


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def gang(attempt: int = 1) -> Gang:
    group = LaunchGroup(0, 2, ("python", "train.py"), (("A", "1"),))
    return Gang("job", attempt, ("n0", "n1"), (group,), "/ck", "/model", "/tb")


def test_every_call_reaches_the_machines_with_its_arguments(rig: Rig) -> None:
    rig.compute.provision_node(make_node("n1"))
    rig.compute.cordon("n1", "xid 79")
    rig.compute.start_repair("n1", RepairAction.REBOOT, 2)
    rig.compute.uncordon("n1")
    rig.compute.delete_node("n1")
    rig.compute.start_workers(gang())
    rig.compute.signal_workers("job", 1, 30.0)
    rig.compute.stop_workers("job", 1)
    assert rig.drain() == [APPLIED] * 8
    node = [c for c in rig.machines.calls if c[0] not in ("start", "signal", "stop")]
    jobs = [c for c in rig.machines.calls if c[0] in ("start", "signal", "stop")]
    assert node == [("provision", "n1"), ("cordon", "n1", "xid 79"),
                    ("repair", "n1", RepairAction.REBOOT, 2), ("uncordon", "n1"),
                    ("delete", "n1")]
    assert jobs == [("start", gang()), ("signal", "job", 1, 30.0),
                    ("stop", "job", 1)]


def test_request_ids_follow_the_ports_idempotency_keys() -> None:
    def rid(op: str, t: float = 1.0, **args: Any) -> str:
        return make_request(op, args, t, 60.0).request_id

    assert rid("start_repair", node_id="n1", action="reboot", attempt=1) == rid(
        "start_repair", 5.0, node_id="n1", action="reset_gpu", attempt=1)
    assert rid("start_repair", node_id="n1", action="reboot", attempt=1) != rid(
        "start_repair", node_id="n1", action="reboot", attempt=2)
    assert rid("signal_workers", job_id="j", attempt=1, grace_s=5) == rid(
        "signal_workers", 9.0, job_id="j", attempt=1, grace_s=5)
    assert rid("signal_workers", job_id="j", attempt=1, grace_s=5) != rid(
        "stop_workers", job_id="j", attempt=1)
    # a state can be asked for again later: cordon, uncordon, cordon are three requests
    assert rid("cordon", 1.0, node_id="n1", reason="r") != rid("cordon", 2.0, node_id="n1",
                                                               reason="r")
    assert rid("cordon", 1.0, node_id="n1", reason="r", seq=1) != rid(
        "cordon", 1.0, node_id="n1", reason="r", seq=3)
    gang = {"job_id": "j", "attempt": 3, "node_ids": ["n2", "n1"]}
    req = make_request("start_workers", {"gang": gang}, 1.0, 60.0)
    assert req.ordering_key == "j"
    # an earlier control plane's per-rank form of the same attempt is the same request
    assert req.request_id == make_request("start_workers", {"workers": [
        {"job_id": "j", "attempt": 3, "rank": 1, "node_id": "n1"},
        {"job_id": "j", "attempt": 3, "rank": 0, "node_id": "n2"}]}, 5.0, 60.0).request_id
    # the same attempt placed elsewhere (a transaction that did not commit, then its retry)
    assert req.request_id != make_request("start_workers", {"gang": {
        **gang, "node_ids": ["n2", "n3"]}}, 1.0, 60.0).request_id
    assert make_request("uncordon", {"node_id": "n7"}, 1.0, 60.0).ordering_key == "n7"


def test_a_duplicate_request_is_applied_once(rig: Rig) -> None:
    for _ in range(3):  # a handler that ran three times asks three times
        rig.compute.start_repair("n1", RepairAction.REBOOT, 1)
    rig.compute.start_repair("n1", RepairAction.REIMAGE, 1)  # same key, another action
    assert rig.drain() == [APPLIED, DUPLICATE, DUPLICATE, DUPLICATE]
    assert rig.machines.calls == [("repair", "n1", RepairAction.REBOOT, 1)]


def test_a_bus_that_delivers_everything_twice_changes_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path, bus=MemoryRequestBus(duplicate=True))
    rig.compute.cordon("n1", "xid")
    rig.compute.uncordon("n1")
    rig.compute.provision_node(make_node("n2"))
    outcomes = rig.drain()
    assert outcomes.count(APPLIED) == 3 and outcomes.count(DUPLICATE) == 3
    assert sorted(rig.machines.calls) == [("cordon", "n1", "xid"), ("provision", "n2"),
                                          ("uncordon", "n1")]
    assert rig.machines.calls.index(("cordon", "n1", "xid")) < rig.machines.calls.index(
        ("uncordon", "n1"))


def test_a_request_past_its_deadline_is_refused_never_applied(rig: Rig) -> None:
    rig.compute.cordon("n1", "xid 79")
    rig.clock.advance(61.0)  # the executor was away longer than the request's TTL
    rig.compute.uncordon("n2")
    assert rig.drain() == [REFUSED, APPLIED]
    assert rig.machines.calls == [("uncordon", "n2")]
    [(attributes, reason)] = rig.refusals.refused
    assert attributes["mtc-op"] == "cordon" and "past its deadline by 1.0 s" in reason
    # its redelivery is still not applied, and not refused (published) a second time
    data, attrs = encode(make_request("cordon", {"node_id": "n1", "reason": "xid 79",
                                                 "seq": 1}, 1000.0, 60.0))
    rig.bus.put(data, attrs, "n1")
    assert rig.drain() == [DUPLICATE]
    assert rig.machines.calls == [("uncordon", "n2")]
    assert len(rig.refusals.refused) == 1


def test_malformed_requests_are_refused_and_acknowledged(rig: Rig) -> None:
    good_data, good = encode(make_request("uncordon", {"node_id": "n1"}, 1000.0, 60.0))
    rig.bus.put(b"not json", good, "n1")
    rig.bus.put(good_data, {**good, "mtc-deadline": "soon"}, "n1")
    rig.bus.put(good_data, {k: v for k, v in good.items() if k != "mtc-schema"}, "n1")
    bad_args = make_request("start_repair", {"node_id": "n1", "action": "explode",
                                             "attempt": 1}, 1000.0, 60.0)
    rig.bus.send(bad_args)
    assert rig.drain() == [MALFORMED] * 4
    assert rig.machines.calls == []
    assert rig.bus.pending == 0
    reasons = [r for _, r in rig.refusals.refused]
    assert "data: is not JSON" in reasons[0]
    assert "mtc-deadline" in reasons[1] and "mtc-schema" in reasons[2]
    assert "explode" in reasons[3]


def test_a_call_that_fails_is_redelivered_before_the_nodes_next_request(rig: Rig) -> None:
    rig.compute.cordon("n1", "xid")
    rig.compute.start_repair("n1", RepairAction.REBOOT, 1)
    rig.compute.uncordon("n2")
    rig.machines.fail = 1  # slurmctld does not answer the first call
    first = rig.bus.receive(10, 0.0)
    # in order per key: n1's second request waits behind its first; n2 is not held up
    assert [d.ordering_key for d in first] == ["n1", "n2"]
    assert [rig.executor.handle(d) for d in first] == [RETRY, APPLIED]
    assert rig.drain() == [APPLIED, APPLIED]
    assert rig.machines.calls == [("uncordon", "n2"), ("cordon", "n1", "xid"),
                                  ("repair", "n1", RepairAction.REBOOT, 1)]


def test_a_streamed_later_request_waits_behind_the_failed_one(rig: Rig) -> None:
    # a streaming pull may already have handed over a node's next request when the one
    # before it fails: that one is held (nacked) until the failed one is applied
    rig.compute.cordon("n1", "xid")
    rig.compute.start_repair("n1", RepairAction.REBOOT, 1)
    rig.compute.cordon("n2", "other")
    first, second, other = (rig.bus.delivery_of(e) for e in rig.bus.entries())
    rig.machines.fail = 1
    assert rig.executor.handle(first) == RETRY
    assert rig.executor.handle(second) == HELD  # not applied before the cordon
    assert rig.executor.handle(other) == APPLIED  # another node is not held up
    assert rig.executor.handle(first) == APPLIED  # redelivered: the key is free again
    assert rig.executor.handle(second) == APPLIED
    assert rig.machines.calls == [("cordon", "n2", "other"), ("cordon", "n1", "xid"),
                                  ("repair", "n1", RepairAction.REBOOT, 1)]


def test_a_hold_ends_with_the_failed_requests_deadline(rig: Rig) -> None:
    rig.compute.cordon("n1", "xid")
    rig.clock.advance(1.0)
    rig.compute.uncordon("n1")
    first, second = (rig.bus.delivery_of(e) for e in rig.bus.entries())
    rig.machines.fail = 1
    assert rig.executor.handle(first) == RETRY
    assert rig.executor.handle(second) == HELD
    rig.clock.advance(60.0)  # the cordon was dead-lettered and never comes back
    assert rig.executor.handle(second) == APPLIED
    assert rig.machines.calls == [("uncordon", "n1")]


def test_one_nodes_requests_are_applied_in_the_order_they_were_asked(rig: Rig) -> None:
    for i in range(5):
        rig.compute.cordon("n1", f"fault {i}")
        rig.compute.uncordon("n1")
        rig.compute.cordon("n2", f"other {i}")
    rig.drain()
    n1 = [c for c in rig.machines.calls if c[1] == "n1"]
    assert n1 == [c for i in range(5) for c in (("cordon", "n1", f"fault {i}"),
                                                ("uncordon", "n1"))]
    assert [c[2] for c in rig.machines.calls if c[1] == "n2"] == [f"other {i}"
                                                                   for i in range(5)]


class _Dies:
    """A delivery whose ack never reaches the bus: the process died right after applying."""

    def __init__(self, inner: Delivery) -> None:
        self.inner = inner
        self.data, self.attributes = inner.data, inner.attributes
        self.ordering_key, self.delivery_attempt = inner.ordering_key, inner.delivery_attempt

    def ack(self) -> None:
        pass

    def nack(self) -> None:
        pass


def test_a_restart_mid_stream_applies_nothing_twice_and_loses_nothing(rig: Rig) -> None:
    rig.compute.provision_node(make_node("n1"))
    rig.compute.start_repair("n2", RepairAction.REBOOT, 1)
    rig.compute.cordon("n3", "xid")
    [a, b, _unhandled] = rig.bus.receive(10, 0.0)
    assert rig.executor.handle(a) == APPLIED  # applied and acknowledged
    assert rig.executor.handle(_Dies(b)) == APPLIED  # applied, recorded, ack lost
    # ... and the process is killed before it handled c
    rig.executor.dedup.close()
    rig.bus.crash()
    rig.restart()
    assert rig.drain() == [DUPLICATE, APPLIED]  # b is known from the record on disk
    assert sorted(rig.machines.calls) == [("cordon", "n3", "xid"), ("provision", "n1"),
                                          ("repair", "n2", RepairAction.REBOOT, 1)]
    assert rig.bus.pending == 0


def test_the_dedup_record_is_bounded(tmp_path: Path) -> None:
    record = DedupRecord(tmp_path, margin_s=10.0, max_records=3)
    for i in range(5):
        record.record(f"r{i}", "cordon", APPLIED, deadline=100.0 + i, now=50.0 + i)
    assert record.prune(now=60.0) == 2  # over the cap: the oldest two go
    assert record.seen("r0") is None and record.seen("r2") == APPLIED
    assert record.prune(now=113.5) == 2  # r2, r3: their deadline is 10 s past
    assert len(record) == 1 and record.seen("r4") == APPLIED


def test_liveness_is_one_overwritten_document_and_silence_is_an_alert(rig: Rig) -> None:
    rig.executor.step(timeout_s=0.0)
    rig.clock.advance(1.0)
    rig.executor.step(timeout_s=0.0)  # within the heartbeat: no write
    [doc] = rig.liveness.read(EXECUTORS, {})
    assert (doc["executor_id"], doc["last_seen"], doc["compute"]) == ("ex-1", 1000.0, "test")
    rig.clock.advance(5.0)
    rig.executor.step(timeout_s=0.0)
    [doc] = rig.liveness.read(EXECUTORS, {})  # still one document: state, not a stream
    assert doc["last_seen"] == 1006.0
    assert alerts.executor_alerts([doc], 1006.0 + 60.0) == []
    [silent] = alerts.executor_alerts([doc], 1006.0 + 61.0)
    assert (silent.kind, silent.subject, silent.severity) == ("executor_silent", "ex-1",
                                                             "CRITICAL")
    listed = alerts.listing([], 1006.0 + 61.0, None, executors=[doc])
    assert [d["kind"] for d in listed] == ["executor_silent"]
    # an executor that beats slowly is judged by its own heartbeat
    assert alerts.executor_alerts([{**doc, "heartbeat_s": 30.0}], 1006.0 + 61.0) == []


def test_the_request_codec_round_trips() -> None:
    req = make_request("start_workers", gang_args(gang()), 12.5, 30.0)
    data, attributes = encode(req)
    back = decode(data, attributes, req.ordering_key)
    assert back == req
    assert back.deadline == 42.5 and not back.expired(42.5) and back.expired(42.6)


class StoreSays:
    """The store's placement of ``job`` as a test sets it (``placements.Placements``)."""

    def __init__(self) -> None:
        self.shown: Placed | None = None

    def placed(self, job_id: str) -> Placed | None:
        return self.shown


def test_a_start_whose_transaction_did_not_commit_never_runs(rig: Rig) -> None:
    """The double start seen on the emulator stack: attempt 2 placed on n0,n1 was published,
    its commit failed, and the retried handler placed attempt 2 on n0,n2 and committed. Only
    the committed placement is applied; the other waits while the store does not show the
    attempt, then is dropped, and the start behind it in the job's order goes next."""
    store = StoreSays()
    rig.executor.placements = store
    rig.executor.commit_poll_s = 0.0  # nack at once: the store here changes only between calls
    rig.compute.start_workers(gang(2))  # n0, n1: this transaction will not commit
    moved = Gang("job", 2, ("n0", "n2"), gang().groups, "/ck", "/model", "/tb")
    rig.compute.start_workers(moved)  # the retry's, committed
    first, second = (rig.bus.delivery_of(e) for e in rig.bus.entries())
    assert rig.executor.handle(first) == RETRY  # the store shows attempt 1 still
    assert rig.executor.handle(second) == HELD  # behind the first, in the job's order
    store.shown = Placed(2, frozenset({"n0", "n2"}))  # the retry committed
    assert rig.executor.handle(first) == SUPERSEDED
    assert rig.executor.handle(second) == APPLIED
    assert rig.machines.calls == [("start", moved)]
    # a start never committed at all is dropped once its wait is over, never applied
    RemoteCompute(rig.bus, rig.clock, ttl_s=600.0).start_workers(gang(3))  # deadline later
    (third,) = (rig.bus.delivery_of(e) for e in rig.bus.entries()[-1:])
    assert rig.executor.handle(third) == RETRY
    rig.clock.advance(placements.COMMIT_WAIT_S + 1)
    assert rig.executor.handle(third) == SUPERSEDED
    assert rig.machines.calls == [("start", moved)]


@pytest.mark.parametrize(("placed", "expected"), [
    (None, placements.WAIT), (Placed(1, frozenset({"a"})), placements.WAIT),
    (Placed(2, frozenset({"a", "b"})), placements.APPLY),
    (Placed(2, frozenset({"a", "c"})), "other nodes"), (Placed(3, frozenset({"a"})), "superseded"),
])
def test_the_placement_verdict(placed: Placed | None, expected: str) -> None:
    got = placements.verdict(2, ["b", "a"], placed, waited_s=1.0)
    assert got == expected or expected in got


def test_a_start_published_just_before_its_commit_is_applied_without_a_nack(rig: Rig) -> None:
    """The usual case: the executor has the start before the store has its attempt; it asks
    the store again for a moment rather than nack at once (a nack loop spent the emulator's
    10 delivery attempts in half a second, and the start was dead-lettered)."""
    store = StoreSays()
    asked = [0]

    def placed(job_id: str) -> Placed | None:
        asked[0] += 1
        return Placed(1, frozenset({"n0", "n1"})) if asked[0] >= 3 else Placed(0, frozenset())

    store.placed = placed  # type: ignore[method-assign]
    rig.executor.placements = store
    rig.compute.start_workers(gang(1))
    assert rig.drain() == [APPLIED]
    assert asked[0] == 3 and rig.machines.calls == [("start", gang(1))]
