"""On the Firestore emulator, a unit of work that only reads writes nothing (Firestore gives
documents back as JSON-like lists; the entities keep tuples)."""

from __future__ import annotations

import pytest

from tests.integration.gcp.gcp_support import firestore_store, reset_firestore
from tests.unit.test_store_queries import assert_reads_write_nothing

pytestmark = pytest.mark.integration


def test_a_read_writes_nothing_on_firestore(emulators: dict[str, str]) -> None:
    reset_firestore()
    assert_reads_write_nothing(firestore_store())


def test_pages_follow_the_order_on_firestore(emulators: dict[str, str]) -> None:
    from tests.unit.test_store_pages import assert_pages_follow_the_order

    reset_firestore()
    assert_pages_follow_the_order(firestore_store())


def test_read_only_units_change_nothing_on_firestore(emulators: dict[str, str]) -> None:
    from tests.unit.test_store_queries import assert_read_only_units_change_nothing

    reset_firestore()
    assert_read_only_units_change_nothing(firestore_store())


def test_a_read_only_transaction_takes_no_lock_a_writer_waits_on(emulators: dict[str, str]
                                                                 ) -> None:
    """An API GET reads in a read-only transaction: a handler's transaction that writes
    what the GET read commits at once, not after the GET (or the lock timeout)."""
    import time

    from shared.adapters.docstore import DocUnitOfWork
    from tests.unit.test_store_queries import add, node

    reset_firestore()
    store = firestore_store()
    add(store, node("n1"))
    reading = store.begin(read_only=True)
    assert reading.get("nodes", "n1") is not None
    t0 = time.monotonic()
    with DocUnitOfWork(store) as uow:
        uow.nodes.get("n1").reason = "written meanwhile"  # type: ignore[union-attr]
        uow.commit()
    took = time.monotonic() - t0
    reading.commit()
    assert took < 5.0, f"the writer waited {took:.1f} s on a reader"
    with DocUnitOfWork(store) as uow:
        assert uow.nodes.get("n1").reason == "written meanwhile"  # type: ignore[union-attr]


def test_a_lookup_scoped_to_an_owner_on_firestore(emulators: dict[str, str]) -> None:
    """Firestore compares the owner in the query: another owner's document comes back as
    an absent one does."""
    from tests.unit.test_owner_lookups import assert_owner_lookups

    reset_firestore()
    assert_owner_lookups(firestore_store())
