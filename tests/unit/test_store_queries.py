"""Queries through the unit of work answer the same on every store, with or without indexes.

MemoryDocStore indexes the fields it is queried on (built on the first query, kept by every
write); sqlite answers from SQL. ``list``, the keys-only ``ids`` and the projection
``project`` must agree with each other and with a plain scan, see the transaction's own
changes, and keep answering right after writes, deletes and prunes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.adapters.docstore import DocUnitOfWork
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.sqlite_store import SqliteDocStore
from shared.domain.model import Node, NodeCondition, NodeRole, NodeState
from shared.ports import IndexedQueries

T = 1_800_000_000.0
FIELDS = ("node_id", "partition", "sound")
IDLE = NodeState.IDLE.value


def node(node_id: str, state: NodeState = NodeState.IDLE, job_id: str | None = None,
         partition: str = "a") -> Node:
    return Node(node_id, "c1", "gpu", partition, NodeRole.WORKER, "a3", "H100", 8, state, T,
                job_id=job_id)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield MemoryDocStore() if request.param == "memory" else SqliteDocStore(tmp_path / "s.db")


def add(store: Any, *nodes: Node) -> None:
    with DocUnitOfWork(store) as uow:
        for n in nodes:
            uow.nodes.add(n)
        uow.commit()


def ids_in_order(store: Any, **equals: Any) -> list[str]:
    with DocUnitOfWork(store) as uow:
        return [n.node_id for n in uow.nodes.list("c1", **equals)]


def test_list_ids_and_project_agree_and_follow_writes(store: Any) -> None:
    add(store, *(node(f"n{i}", partition="a" if i % 2 else "b") for i in range(10)))
    assert ids_in_order(store, state=NodeState.IDLE, partition="a") == ["n1", "n3", "n5", "n7",
                                                                         "n9"]
    with DocUnitOfWork(store) as uow:  # the job takes n3 and n5; n7 leaves the fleet
        for node_id in ("n3", "n5"):
            n = uow.nodes.get(node_id)
            assert n is not None
            n.transition(NodeState.ALLOCATED, T + 1)
            n.job_id = "j1"
        uow.delete_record("nodes", "n7")
        uow.commit()
    assert ids_in_order(store, state=NodeState.IDLE, partition="a") == ["n1", "n9"]
    assert ids_in_order(store, job_id="j1") == ["n3", "n5"]
    with DocUnitOfWork(store) as uow:
        assert uow.nodes.ids("c1", job_id="j1", state=NodeState.ALLOCATED, sound=True) == {
            "n3", "n5"}
        assert uow.nodes.project("c1", FIELDS, state=NodeState.IDLE, partition="a") == [
            ("n1", "a", True), ("n9", "a", True)]


def test_the_transactions_own_changes_answer_before_the_stored_documents(store: Any) -> None:
    add(store, node("n1"), node("n2"), node("n3"))
    with DocUnitOfWork(store) as uow:
        n2 = uow.nodes.get("n2")
        assert n2 is not None
        n2.transition(NodeState.ALLOCATED, T + 1)
        n2.job_id = "j1"
        uow.nodes.add(node("n4", NodeState.ALLOCATED, "j1"))
        assert uow.nodes.ids("c1", job_id="j1") == {"n2", "n4"}
        assert uow.nodes.ids("c1", state=NodeState.IDLE) == {"n1", "n3"}
        # a stored match this transaction changed is answered from its entity, in place
        assert uow.nodes.project("c1", ("node_id", "state"), state=NodeState.IDLE) == [
            ("n1", IDLE), ("n2", NodeState.ALLOCATED.value), ("n3", IDLE)]
        assert [n.node_id for n in uow.nodes.list("c1", state=NodeState.IDLE)] == [
            "n1", "n2", "n3"]


def test_a_transactions_own_changes_do_not_leak_into_the_stores_answers(store: Any) -> None:
    """``ids`` may hand out an index's own bucket (read-only): the changes a transaction
    makes to its answer are its own, and one rolled back leaves every later answer as it was."""
    add(store, node("n1"), node("n2"), node("n3", NodeState.ALLOCATED, "j1"))
    with DocUnitOfWork(store) as uow:
        assert uow.nodes.ids("c1", state=NodeState.IDLE) == {"n1", "n2"}  # (builds the index)
    with DocUnitOfWork(store) as uow:  # n1 leaves the idle set, n4 joins it; never committed
        n1 = uow.nodes.get("n1")
        assert n1 is not None
        n1.transition(NodeState.ALLOCATED, T + 1)
        uow.nodes.add(node("n4"))
        assert uow.nodes.ids("c1", state=NodeState.IDLE) == {"n2", "n4"}
    with DocUnitOfWork(store) as uow:
        assert uow.nodes.ids("c1", state=NodeState.IDLE) == {"n1", "n2"}
        assert uow.nodes.ids("c1", job_id="j1") == {"n3"}


def test_a_condition_that_ends_a_job_makes_a_node_unsound(store: Any) -> None:
    sick, slow = node("n1", NodeState.ALLOCATED, "j1"), node("n2", NodeState.ALLOCATED, "j1")
    sick.conditions["XidError"] = NodeCondition("true", "xid 79", T, T)
    slow.conditions["SlowSpeedCheck"] = NodeCondition("true", "0.7x", T, T)
    faulted = node("n3", NodeState.ALLOCATED, "j1")
    faulted.fault = "gpu_fell_off_bus"
    add(store, sick, slow, faulted, node("n4", NodeState.ALLOCATED, "j1"))
    with DocUnitOfWork(store) as uow:
        assert uow.nodes.ids("c1", job_id="j1", sound=True) == {"n2", "n4"}
        assert uow.nodes.ids("c1", job_id="j1", sound=False) == {"n1", "n3"}


def test_memory_indexes_survive_prunes_and_unhashable_values() -> None:
    store = MemoryDocStore()
    for i in range(6):
        store.write("events", f"e{i}", {"time": float(i), "kind": "a" if i < 3 else ["b"]})
    assert [d["time"] for d in store.read("events", {"kind": "a"})] == [0.0, 1.0, 2.0]
    assert [d["time"] for d in store.read("events", {"kind": ["b"]})] == [3.0, 4.0, 5.0]
    assert store.prune("events", 2.0, 10) == 2
    assert [d["time"] for d in store.read("events", {"kind": "a"})] == [2.0]
    store.write("events", "e1", {"time": 9.0, "kind": "a"})  # back, now last in scan order
    assert [d["time"] for d in store.read("events", {"kind": "a"})] == [2.0, 9.0]
    store.write("events", "e2", {"time": 2.0, "kind": "c"})  # a value changed in place
    assert [d["time"] for d in store.read("events", {"kind": "a"})] == [9.0]
    assert store.read("events", {"kind": "c"}) == [{"time": 2.0, "kind": "c"}]


def test_a_restart_reads_only_the_unsound_nodes_of_its_job(store: Any) -> None:
    """``job_nodes.unsound``: from the ``sound_for`` index, in rank order; none when every
    rank's node is sound and allocated to the job (holes hold no node)."""
    from shared.domain.model import Job
    from shared.service_layer import job_nodes

    add(store, *(node(f"n{i}", NodeState.ALLOCATED, "j1") for i in range(6)))
    job = Job.__new__(Job)
    job.cluster_id, job.job_id = "c1", "j1"
    job.node_ids = ("n0", "n1", "", "n3", "n4", "n5")  # as Job.__post_init__ keeps them
    with DocUnitOfWork(store) as uow:
        assert job_nodes.unsound(job, uow) == []
        hot = uow.nodes.get("n4")
        assert hot is not None
        hot.conditions["XidError"] = NodeCondition("true", "xid 79", T, T)
        released = uow.nodes.get("n1")
        assert released is not None
        released.job_id = None
        uow.commit()
    with DocUnitOfWork(store) as uow:
        assert job_nodes.unsound(job, uow) == ["n1", "n4"]
        assert uow.nodes.ids("c1", sound_for="j1") == {"n0", "n2", "n3", "n5"}


def test_a_bucket_emptied_by_removals_is_rebuilt_and_still_answers() -> None:
    """A Python set never shrinks: the idle bucket of a fleet whose nodes were all allocated
    would keep walking a table sized for the fleet. The store rebuilds it, and every query
    answers as a scan does before and after."""
    import sys

    store = MemoryDocStore()
    add(store, *(node(f"n{i:04d}") for i in range(3000)))
    assert len(ids_in_order(store, state=NodeState.IDLE)) == 3000  # builds the index
    with DocUnitOfWork(store) as uow:
        for i in range(2990):
            n = uow.nodes.get(f"n{i:04d}")
            assert n is not None
            n.transition(NodeState.ALLOCATED, T + 1)
            n.job_id = "j1"
        uow.commit()
    bucket = store._indexes["nodes"]["state"][IDLE]
    assert len(bucket) == 10 and sys.getsizeof(bucket) < 8192  # not the 3,000-id table
    assert ids_in_order(store, state=NodeState.IDLE) == [f"n{i:04d}" for i in range(2990, 3000)]
    with DocUnitOfWork(store) as uow:
        assert uow.nodes.ids("c1", state=NodeState.IDLE, partition="a") == {
            f"n{i:04d}" for i in range(2990, 3000)}
        assert len(uow.nodes.ids("c1", state=NodeState.ALLOCATED, job_id="j1")) == 2990


def assert_reads_write_nothing(store: Any) -> None:
    """A unit of work that only reads (a GET of the API, a handler that decides nothing)
    writes nothing at commit, whatever form the store gives documents back in (tuples as
    tuples in memory, lists through JSON): a spurious write is a contended transaction on
    Firestore (a read of a job failed with 'Transaction lock timeout')."""
    from shared.domain.health import FailureRecord, RepairAction
    from shared.domain.model import Checkpoint, Job, JobState
    from shared.domain.specs import CustomJobSpec
    from tests.harness import job_body

    sick = node("n1", NodeState.ALLOCATED, job_id="j1")
    sick.conditions["XidError"] = NodeCondition("true", "xid 79", T, T + 1)
    sick.history.append(FailureRecord(T, "gpu_fell_off_bus", RepairAction.REBOOT))
    job = Job("j1", "c1", CustomJobSpec.from_dict(job_body()), JobState.RUNNING, T, T,
              node_ids=("n1", ""), previous_node_ids=("n1", "n2"),
              checkpoints=[Checkpoint(10, "gs://b/c/10", T, 1, 2.0)])
    with DocUnitOfWork(store) as uow:
        uow.nodes.add(sick)
        uow.jobs.add(job)
        uow.commit()
    puts: list[tuple[str, str]] = []
    # (an IndexedQueries store's units of work begin through ``begin_indexed``)
    opener = "begin_indexed" if isinstance(store, IndexedQueries) else "begin"
    begin = getattr(store, opener)

    def spying(**kw: Any) -> Any:
        txn = begin(**kw)
        put = txn.put

        def counted(collection: str, doc_id: str, doc: dict[str, Any]) -> None:
            puts.append((collection, doc_id))
            put(collection, doc_id, doc)

        txn.put = counted
        return txn

    setattr(store, opener, spying)
    try:
        with DocUnitOfWork(store) as uow:
            assert uow.nodes.get("n1") == sick
            assert uow.jobs.get("j1") == job
            assert [n.node_id for n in uow.nodes.list("c1")] == ["n1"]
            assert [j.job_id for j in uow.jobs.list("c1")] == ["j1"]
            uow.commit()
        with DocUnitOfWork(store) as uow:  # the spy sees a write
            uow.nodes.get("n1").reason = "seen"  # type: ignore[union-attr]
            uow.commit()
    finally:
        setattr(store, opener, begin)
    assert puts == [("nodes", "n1")]
    puts.clear()
    assert puts == []


def test_a_read_writes_nothing(store: Any) -> None:
    assert_reads_write_nothing(store)


def assert_read_only_units_change_nothing(store: Any) -> None:
    """A read-only unit of work (an API GET) reads what is committed, and a change in it is a
    bug that fails its commit and writes nothing; its transaction refuses writes itself."""
    from shared.adapters.uow_pool import PooledUnitsOfWork
    from shared.ports import ReadOnlyWrite

    add(store, node("n1"))
    units = PooledUnitsOfWork(store)
    with units(read_only=True) as uow:
        assert uow.nodes.get("n1") == node("n1")
        assert [n.node_id for n in uow.nodes.list("c1")] == ["n1"]
        uow.commit()
    with units(read_only=True) as uow:
        uow.nodes.get("n1").reason = "changed in a read"  # type: ignore[union-attr]
        with pytest.raises(ReadOnlyWrite, match="nodes/n1"):
            uow.commit()
    with units(read_only=True) as uow:
        uow.nodes.add(node("n2"))
        with pytest.raises(ReadOnlyWrite, match="nodes/n2"):
            uow.commit()
    with units() as uow:  # the pool hands the same unit out again, read-write this time
        assert uow.nodes.get("n1") == node("n1") and uow.nodes.get("n2") is None
        uow.nodes.get("n1").reason = "a write"  # type: ignore[union-attr]
        uow.commit()
    txn = store.begin(read_only=True)
    with pytest.raises(ReadOnlyWrite):
        txn.put("nodes", "n3", node("n3").to_dict())
    with pytest.raises(ReadOnlyWrite):
        txn.delete("nodes", "n1")
    assert txn.get("nodes", "n1")["reason"] == "a write"
    txn.commit()
    assert ids_in_order(store) == ["n1"]


def test_read_only_units_change_nothing(store: Any) -> None:
    assert_read_only_units_change_nothing(store)


def test_a_read_only_sqlite_transaction_does_not_hold_up_another_process(tmp_path: Path
                                                                          ) -> None:
    """Deferred, over WAL: a reader holding its snapshot does not block another connection's
    writer (BEGIN IMMEDIATE would, for up to the 30 s busy timeout), and keeps its snapshot."""
    import time

    path = tmp_path / "s.db"
    reader, writer = SqliteDocStore(path), SqliteDocStore(path)
    add(reader, node("n1"))
    txn = reader.begin(read_only=True)
    try:
        assert txn.get("nodes", "n1") is not None
        t0 = time.monotonic()
        with DocUnitOfWork(writer) as uow:
            uow.nodes.get("n1").reason = "written meanwhile"  # type: ignore[union-attr]
            uow.commit()
        assert time.monotonic() - t0 < 5.0  # not the busy timeout
        assert txn.get("nodes", "n1")["reason"] == ""  # type: ignore[index]
    finally:
        txn.commit()
    with DocUnitOfWork(reader) as uow:
        assert uow.nodes.get("n1").reason == "written meanwhile"  # type: ignore[union-attr]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "put", "put", "remove", "prune"]),
                          st.sampled_from([f"r{i}" for i in range(12)]),
                          st.integers(0, 5), st.integers(1, 5)), max_size=60),
       st.booleans())
def test_a_prune_removes_the_oldest_before_its_horizon_as_a_scan_would(
        steps: list[tuple[str, str, int, int]], in_time_order: bool) -> None:
    """The memory store prunes a collection written in time order (each document once) from
    its start, stopping at the first young one; any other collection by a scan. Both remove
    what a scan for the ``limit`` oldest older than the horizon removes."""
    store, model, clock = MemoryDocStore(), {}, 0.0
    for op, key, step, limit in steps:
        at = (clock := clock + step) if in_time_order else float(step * 10)
        if op == "put":
            if in_time_order and key in model:
                continue  # (written once: a rewrite would leave the time order)
            store.write("processed_events", key, {"key": key, "time": at})
            model[key] = at
        elif op == "remove":
            store.remove("processed_events", key)
            model.pop(key, None)
        else:
            horizon = at - 3
            old = sorted(model, key=lambda k: model[k])
            old = [k for k in old if model[k] < horizon][:limit]
            assert store.prune("processed_events", horizon, limit) == len(old)
            for k in old:
                del model[k]
        assert {k: d["time"] for k, d in store.data["processed_events"].items()} == model
    if in_time_order:
        assert "processed_events" not in store._unordered


class _Ids:
    """A unit of work's node repository that answers ``ids`` with a fixed set (or set-like)."""

    def __init__(self, fine: Any) -> None:
        self.fine = fine

    def ids(self, cluster_id: str, **equals: Any) -> Any:
        return self.fine


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["sound", "unsound", "hole"]), min_size=0, max_size=700),
       st.booleans())
def test_unsound_agrees_with_a_pass_over_every_rank(kinds: list[str], set_like: bool) -> None:
    """``job_nodes.unsound`` searches the runs between holes a block of ranks at a time; its
    answer is the plain pass's (rank order, no holes), for sets and other set-likes, across
    block edges (700 ranks: three blocks)."""
    from collections.abc import Set as AbstractSet
    from types import SimpleNamespace

    from shared.domain.model import Job
    from shared.service_layer import job_nodes

    ranks = tuple("" if k == "hole" else f"n{i:04d}" for i, k in enumerate(kinds))
    fine = {n for n, k in zip(ranks, kinds, strict=True) if k == "sound"}

    class _View(AbstractSet[str]):  # a read-only view, as a store may hand out
        def __contains__(self, x: object) -> bool:
            return x in fine

        def __iter__(self) -> Any:
            return iter(fine)

        def __len__(self) -> int:
            return len(fine)

    job = Job.__new__(Job)
    job.cluster_id, job.job_id, job.node_ids = "c1", "j1", ranks
    uow = SimpleNamespace(nodes=_Ids(_View() if set_like else fine))
    expected = [n for n, k in zip(ranks, kinds, strict=True) if k == "unsound"]
    assert job_nodes.unsound(job, uow) == expected  # type: ignore[arg-type]
