"""SimBus logs each envelope once (duplicates included) and forgets the ids it logged longer
ago than the idempotency window, so its dedup set does not grow with the run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import simpy

from shared.domain.events import NodeProvisioned
from shared.handling import Routes
from simulator import bus as bus_module
from simulator.bus import SimBus
from simulator.clock import SimClock, call_later
from simulator.readers import Dist
from simulator.scenario_types import BusCfg

WINDOW_S = 3600.0


def _bus(duplicate: float) -> tuple[simpy.Environment, SimBus]:
    env = simpy.Environment()
    cfg = BusCfg(latency=Dist.fixed(0.05), duplicate=duplicate, reorder=0.0,
                 reorder_delay=Dist.fixed(0.0), retry_delay_s=1.0, max_deliveries=3)
    bus = SimBus(env, cfg, np.random.default_rng(1), SimClock(env), Routes({}))
    deps: Any = SimpleNamespace(config=SimpleNamespace(idempotency_window_s=WINDOW_S))
    bus.deps = deps
    return env, bus


def _emit(bus: SimBus, i: int) -> None:
    bus.emit(NodeProvisioned(node_id=f"n{i}"), "test")


def test_a_duplicate_is_logged_once() -> None:
    env, bus = _bus(duplicate=1.0)  # every envelope delivered twice
    for i in range(50):
        call_later(env, float(i), _emit, bus, i)
    env.run()
    assert bus.stats.duplicates == 50
    assert bus.stats.delivered == 50
    assert len(bus.rows) == 50
    assert len({row["id"] for row in bus.rows}) == 50


def test_ids_older_than_the_window_are_forgotten(monkeypatch: Any) -> None:
    monkeypatch.setattr(bus_module, "PRUNE_EVERY", 100)
    env, bus = _bus(duplicate=0.0)
    bus._next_prune = 100
    events = 2_000  # one a minute for 33 hours: the window holds 60 of them
    for i in range(events):
        call_later(env, 60.0 * i, _emit, bus, i)
    env.run()
    assert bus.stats.delivered == events
    assert len(bus.rows) == events  # the event log keeps everything; only the ids go
    assert len(bus._seen) <= 60 + 100 + 1
    newest = max(bus._seen.values())
    assert all(newest - at <= WINDOW_S + 60.0 * 100 for at in bus._seen.values())


@pytest.mark.slow
def test_the_twins_store_keeps_only_the_idempotency_records_of_its_window() -> None:
    """The twin prunes its store's idempotency records when the bus forgets its ids, as the
    embedded control plane's sweeper does: a run ends with those of the last window and of
    the deliveries since the last prune, not one per delivery of the whole run."""
    from simulator import twin
    from simulator.scenario import load_scenario

    tw = twin.Twin(load_scenario(None, {"duration": "130d"}))
    deliveries = tw.run().events
    records = list(tw.store.data["processed_events"].values())
    interval = twin.PRUNE_EVERY_NTH * bus_module.PRUNE_EVERY  # ids logged between prunes
    assert deliveries > interval + bus_module.PRUNE_EVERY  # the store was pruned
    newest = max(r["time"] for r in records)
    window = tw.config.idempotency_window_s
    older = [r for r in records if r["time"] < newest - window]
    assert len(older) <= 1.2 * interval  # those since the last prune at most
    assert len(records) < deliveries * 0.8
