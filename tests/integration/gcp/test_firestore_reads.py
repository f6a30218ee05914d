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
