"""A lookup scoped to an owner (``get_if``: the API's records by parent, jobs by cluster)
answers the same on every store, and a document of another owner is not read: it comes back
as an absent one does, without the store handing it over."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.docstore import DocUnitOfWork
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.sqlite_store import _OWNED_GET, OWNERS, SqliteDocStore
from shared.domain.model import Job, JobState
from shared.domain.specs import CustomJobSpec
from tests.harness import job_body

A, B = "projects/a/locations/l", "projects/b/locations/l"
T = 1_800_000_000.0


def make_job(job_id: str, cluster_id: str) -> Job:
    return Job(job_id, cluster_id, CustomJobSpec.from_dict(job_body()), JobState.QUEUED, T, T)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    yield MemoryDocStore() if request.param == "memory" else SqliteDocStore(tmp_path / "s.db")


def assert_owner_lookups(store: Any) -> None:
    """What every store answers (the Firestore emulator's test runs it too)."""
    with DocUnitOfWork(store) as uow:
        uow.put_record("api_resources", "customJob:1", {"id": "1", "parent": A, "big": "x"})
        uow.jobs.add(make_job("j1", cluster_id="ca"))
        uow.commit()
    with DocUnitOfWork(store, read_only=True) as uow:
        mine = uow.record("api_resources", "customJob:1", where={"parent": A})
        assert mine is not None and mine["big"] == "x"
        assert uow.record("api_resources", "customJob:1", where={"parent": B}) is None
        assert uow.record("api_resources", "customJob:2", where={"parent": A}) is None
        job = uow.jobs.get_on("ca", "j1")
        assert job is not None and job.job_id == "j1"
        assert uow.jobs.get_on("cb", "j1") is None and uow.jobs.get_on("ca", "j2") is None
        uow.commit()
    with DocUnitOfWork(store) as uow:  # the transaction's own writes answer first
        uow.put_record("api_resources", "customJob:1", {"id": "1", "parent": B})
        assert uow.record("api_resources", "customJob:1", where={"parent": A}) is None
        assert uow.record("api_resources", "customJob:1", where={"parent": B}) is not None
        loaded = uow.jobs.get("j1")
        assert loaded is not None and uow.jobs.get_on("ca", "j1") is loaded
        assert uow.jobs.get_on("cb", "j1") is None
        uow.rollback()


def test_a_lookup_scoped_to_an_owner_answers_alike_on_every_store(store: Any) -> None:
    assert_owner_lookups(store)


def test_sqlite_compares_the_owner_in_an_index_never_reading_the_document(
        tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    assert_owner_lookups(SqliteDocStore(path))
    conn = sqlite3.connect(path)
    for collection in OWNERS:
        plan = " ".join(row[3] for row in conn.execute(
            f"EXPLAIN QUERY PLAN {_OWNED_GET[collection]}", ("k", "v")))
        assert f"USING INDEX docs_by_{OWNERS[collection]}" in plan, plan
        assert "<expr>=?" in plan, plan  # the owner is one of the index's search terms
    # an index made when the state directory was opened covers what was stored before it
    conn.execute("DROP INDEX docs_by_parent")
    conn.commit()
    conn.close()
    reopened = SqliteDocStore(path)
    with DocUnitOfWork(reopened, read_only=True) as uow:
        assert uow.record("api_resources", "customJob:1", where={"parent": A}) is not None
        assert uow.record("api_resources", "customJob:1", where={"parent": B}) is None
        uow.commit()
    reopened.close()
