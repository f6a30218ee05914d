"""Callers ask an adapter for a declared port (``isinstance``), never for an attribute by
name: these pin which adapter offers which optional port, so a renamed method fails here
instead of silently turning a capability off."""

from __future__ import annotations

import pytest

from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.local.warm import LocalWarm
from shared.adapters.compute.remote.compute import RemoteCompute
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.sqlite_store import SqliteDocStore
from shared.ports import (
    Closeable,
    FaultInjection,
    KeyQueries,
    Polled,
    Pruning,
    RangeReads,
    StorageSpace,
    WarmProcesses,
)
from simulator.compute import SimCompute


@pytest.mark.parametrize(("adapter", "port", "offered"), [
    (LocalCompute, Polled, True),
    (SlurmCompute, Polled, True),
    (RemoteCompute, Polled, False),  # told by the executor's results, never looks itself
    (LocalCompute, FaultInjection, True),
    (SlurmCompute, FaultInjection, False),  # a fault is a kernel-log line on the node
    (SimCompute, FaultInjection, False),
    (LocalCompute, StorageSpace, True),  # a full disk's job waits for room (storage.py)
    (SlurmCompute, StorageSpace, True),
    (RemoteCompute, StorageSpace, False),  # the job goes at once; its next attempt tells
    (SimCompute, StorageSpace, False),
    (LocalCompute, Closeable, True),
    (LocalWarm, WarmProcesses, True),  # the local start loop's held ranks and standbys
    (SqliteDocStore, Closeable, True),
    (SqliteDocStore, RangeReads, True),
    (SqliteDocStore, Pruning, True),
    (SqliteDocStore, KeyQueries, True),  # a state's jobs are ids from an index
    (MemoryDocStore, KeyQueries, False),  # it has IndexedQueries, which does more
    (MemoryDocStore, RangeReads, True),
    (MemoryDocStore, Pruning, True),
])
def test_each_adapter_offers_the_ports_it_declares(adapter: type, port: type,
                                                  offered: bool) -> None:
    assert issubclass(adapter, port) is offered
