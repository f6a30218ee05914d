"""The twin's pool of units of work (``shared.adapters.uow_pool``): a unit that ended is
handed out again, never to two holders at once, whatever its last holder does with it."""

from __future__ import annotations

import pytest

from shared.adapters.docstore import DocUnitOfWork, DocUnitsOfWork
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.uow_pool import PooledUnitsOfWork
from shared.domain.model import Node, NodeRole, NodeState

T = 1_800_000_000.0


def node(node_id: str) -> Node:
    return Node(node_id, "c1", "gpu", "a", NodeRole.WORKER, "a3", "H100", 8, NodeState.IDLE, T)


def test_a_unit_that_ended_is_handed_out_again_and_starts_empty() -> None:
    units = PooledUnitsOfWork(MemoryDocStore())
    first = units()
    with first as uow:
        uow.nodes.add(node("n1"))
        uow.commit()
    assert units.free == 1
    again = units(read_only=True)
    assert again is first and units.free == 0 and again.read_only
    with again as uow:
        assert uow._tracked == {} and uow.nodes.get("n1") == node("n1")
        uow.commit()
    with units() as uow:  # read-write again, and what it did is gone
        assert not uow.read_only and not uow.emitted


def test_nested_and_concurrent_units_are_each_their_own() -> None:
    units = PooledUnitsOfWork(MemoryDocStore())
    with units() as outer:
        inner = units()
        assert inner is not outer
        with inner:
            inner.rollback()
        assert units.free == 1  # the inner one ended; the outer is still in use
        assert units() is inner and units() is not outer


def test_at_most_keep_wait() -> None:
    units = PooledUnitsOfWork(MemoryDocStore(), keep=2)
    made = [units() for _ in range(5)]
    for uow in made:
        with uow:
            pass
    assert units.free == 2


def test_a_stale_holder_that_enters_again_takes_its_unit_out_of_the_pool() -> None:
    """A holder keeps its unit after it ended (given back), and enters it again: the pool
    must not hand that unit to anyone else while the stale holder uses it."""
    units = PooledUnitsOfWork(MemoryDocStore())
    stale = units()
    with stale:
        pass
    assert units.free == 1
    with stale as uow:  # entered again after it was given back
        assert units.free == 0
        other = units()
        assert other is not stale  # a fresh one, not the unit in use
        uow.nodes.add(node("n1"))
        uow.commit()
    assert units.free == 1  # given back once more, once
    with other:
        pass
    assert units.free == 2
    assert {id(units()), id(units())} == {id(stale), id(other)}


def test_a_unit_handed_out_again_cannot_be_entered_by_its_stale_holder_at_once() -> None:
    """The stale holder's unit was handed to someone else meanwhile: both may hold it, but
    entering it while the other is inside raises instead of sharing one transaction."""
    units = PooledUnitsOfWork(MemoryDocStore())
    stale = units()
    with stale:
        pass
    current = units()
    assert current is stale
    with current, pytest.raises(RuntimeError, match="in use"):
        stale.__enter__()


def test_production_builds_a_new_unit_per_call() -> None:
    units = DocUnitsOfWork(MemoryDocStore())
    first = units()
    with first:
        pass
    second = units(read_only=True)
    assert isinstance(second, DocUnitOfWork) and second is not first and second.read_only
