"""The store port's page (``DocTransaction.page``): the same answer on every store, a page at a
time in (order field, id) order; a unit of work's ``records_page`` lays its own writes over it.
On sqlite a page is a range of an index, and a read never waits for a writer: each thread
reads through a connection of its own (Firestore: tests/integration/gcp/test_firestore_reads.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.docstore import API_RESOURCES, DocUnitOfWork
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.sqlite_store import SqliteDocStore

MINE = {"kind": "customJob", "parent": "projects/a/locations/l"}


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made = MemoryDocStore() if request.param == "memory" else SqliteDocStore(tmp_path / "s.db")
    yield made
    if isinstance(made, SqliteDocStore):
        made.close()


def record(doc_id: str, created: float, **fields: Any) -> dict[str, Any]:
    return {**MINE, "id": doc_id, "created": created, "_id": doc_id, **fields}


def assert_pages_follow_the_order(store: Any) -> None:
    """Twelve records of one kind under one parent (creation times tied in pairs, written out
    of order) among others': the whole list, then pages of five after each one's last key,
    give them in (created, id) order; a unit of work's page shows its own writes first."""
    order = [f"r{i:02d}" for i in range(12)]
    with DocUnitOfWork(store) as uow:
        for i in (7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6):
            uow.put_record(API_RESOURCES, order[i], record(order[i], float(i // 2)))
        uow.put_record(API_RESOURCES, "other-kind", record("other-kind", 0.5, kind="cluster"))
        uow.put_record(API_RESOURCES, "other-parent", record("other-parent", 0.5,
                                                             parent="projects/b/locations/l"))
        uow.commit()
    txn = store.begin(read_only=True)
    try:
        whole = txn.page(API_RESOURCES, MINE, "created", limit=100)
        assert [doc_id for doc_id, _ in whole] == order
        assert all(doc["_id"] == doc_id for doc_id, doc in whole)
        walked: list[str] = []
        after = None
        while page := txn.page(API_RESOURCES, MINE, "created", after=after, limit=5):
            assert len(page) <= 5
            walked += [doc_id for doc_id, _ in page]
            after = (page[-1][1]["created"], page[-1][0])
        assert walked == order
        assert txn.page(API_RESOURCES, {**MINE, "kind": "none"}, "created", limit=5) == []
    finally:
        txn.commit()
    with DocUnitOfWork(store) as uow:  # its own writes, not yet committed, over the store's
        uow.put_record(API_RESOURCES, "new", record("new", 0.5))
        uow.delete_record(API_RESOURCES, "r00")
        uow.put_record(API_RESOURCES, "r02", record("r02", 9.0))  # moved to the end
        mine = [doc_id for doc_id, _ in uow.records_page(API_RESOURCES, MINE, "created",
                                                         limit=4)]
        assert mine == ["r01", "new", "r03", "r04"]
        rest = uow.records_page(API_RESOURCES, MINE, "created", after=(2.0, "r04"), limit=20)
        assert [doc_id for doc_id, _ in rest] == [*order[5:], "r02"]
        uow.rollback()


def test_pages_follow_the_order_on_every_store(store: Any) -> None:
    assert_pages_follow_the_order(store)


def plans(store: SqliteDocStore, read: Any) -> str:
    """The query plans of the statements ``read(txn)`` runs in a read-only transaction."""
    statements: list[str] = []
    txn = store.begin(read_only=True)
    txn._conn.set_trace_callback(statements.append)
    try:
        read(txn)
    finally:
        txn._conn.set_trace_callback(None)
        txn.commit()
    selects = [s for s in statements if s.startswith("SELECT")]
    return " ".join(str(row) for s in selects
                    for row in store._conn.execute(f"EXPLAIN QUERY PLAN {s}").fetchall())


def test_a_sqlite_page_is_a_range_of_its_index(tmp_path: Path) -> None:
    """A page seeks to its start in ``docs_by_listing`` and reads on in the index's order (no
    sort, no scan of the pages before); a state's jobs are ids from ``docs_by_state``."""
    store = SqliteDocStore(tmp_path / "s.db")
    try:
        plan = plans(store, lambda txn: txn.page(API_RESOURCES, MINE, "created",
                                                 after=(2.0, "r04"), limit=5))
        assert "docs_by_listing (collection=? AND <expr>=? AND <expr>=? AND <expr>>?)" in plan
        assert "TEMP B-TREE" not in plan, plan
        states = plans(store, lambda txn: txn.ids("jobs", {"state": "JOB_STATE_RUNNING"}))
        assert "INDEX docs_by_state (collection=? AND <expr>=?)" in states, states
    finally:
        store.close()


def test_defect_10_a_sqlite_read_never_waits_for_a_write_transaction(tmp_path: Path) -> None:
    """The control loop's transaction holds the writing connection: a GET's read-only
    transaction and a plain read on another thread answer at once, with what is committed;
    the writing thread itself still reads its own uncommitted writes."""
    store = SqliteDocStore(tmp_path / "s.db")
    store.write("nodes", "n1", {"node_id": "n1", "reason": "committed"})
    writing, release, seen = threading.Event(), threading.Event(), []

    def writer() -> None:
        txn = store.begin()
        txn.put("nodes", "n1", {"node_id": "n1", "reason": "uncommitted"})
        seen.append(store.read("nodes", {"node_id": "n1"})[0]["reason"])
        writing.set()
        release.wait(10)
        txn.commit()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert writing.wait(10)
        t0 = time.monotonic()
        txn = store.begin(read_only=True)
        assert txn.get("nodes", "n1") == {"node_id": "n1", "reason": "committed"}
        txn.commit()
        assert store.read("nodes", {"node_id": "n1"})[0]["reason"] == "committed"
        assert time.monotonic() - t0 < 1.0  # not behind the writer's lock
    finally:
        release.set()
        thread.join(10)
    assert seen == ["uncommitted"]
    assert store.read("nodes", {"node_id": "n1"})[0]["reason"] == "uncommitted"
    store.close()
    with pytest.raises(Exception, match="closed"):
        store.read("nodes", {})
