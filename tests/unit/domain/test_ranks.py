"""The rank helpers give what the per-rank loops they replaced gave, for small and large sets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain import ranks

NODES = [f"n{i}" for i in range(100)]


@st.composite
def ranked(draw: st.DrawFn) -> tuple[list[str], set[str]]:
    """A job's ranks (unique nodes, some holes) and a subset of its nodes."""
    node_ids = draw(st.lists(st.sampled_from(NODES), unique=True, max_size=80))
    holes = draw(st.lists(st.integers(0, max(0, len(node_ids) - 1)), max_size=5))
    for i in holes:
        if node_ids:
            node_ids[i] = ""
    held = [n for n in node_ids if n]
    subset = set(draw(st.lists(st.sampled_from(held), max_size=len(held)))) if held else set()
    return node_ids, subset


@given(ranked())
def test_in_rank_order_is_the_loop(case: tuple[list[str], set[str]]) -> None:
    node_ids, subset = case
    assert ranks.in_rank_order(subset, node_ids) == [n for n in node_ids if n in subset]


@given(ranked())
def test_with_holes_is_the_loop(case: tuple[list[str], set[str]]) -> None:
    node_ids, gone = case
    out = ranks.with_holes(tuple(node_ids), gone)
    assert out == tuple("" if n in gone else n for n in node_ids)
    assert type(out) is ranks.Ranks  # immutable: a job's document shares it


def test_fill_holes_in_rank_order() -> None:
    assert ranks.fill_holes(("a", "", "c", ""), ["x", "y"]) == ("a", "x", "c", "y")
    assert ranks.fill_holes(("", ""), ["x", "y"]) == ("x", "y")


@pytest.mark.parametrize("placed", [["x"], ["x", "y", "z"]])
def test_fill_holes_refuses_a_count_that_does_not_match(placed: list[str]) -> None:
    with pytest.raises(ValueError, match="rank"):
        ranks.fill_holes(["a", "", ""], placed)


def _holes(node_ids: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(i for i, n in enumerate(node_ids) if not n)


@given(ranked(), st.integers(0, 80), st.integers(0, 80))
def test_holes_are_the_loop_also_for_the_tuples_the_helpers_made(
        case: tuple[list[str], set[str]], first: int, count: int) -> None:
    """``holes`` of a plain tuple, of :class:`Ranks` (asked twice: found once, then known) and
    of the values ``with_holes`` and ``fill_holes`` made: what a loop finds."""
    node_ids, gone = case
    start = tuple(node_ids)
    assert ranks.holes(start) == _holes(start)
    assert ranks.holes(start) == _holes(start)  # remembered
    assert ranks.holes_in(start, first, count) == sum(
        1 for i in _holes(start) if first <= i < first + count)
    emptied = ranks.with_holes(start, gone)
    assert ranks.holes(emptied) == _holes(emptied)
    filled = ranks.fill_holes(emptied, [f"p{i}" for i in range(len(_holes(emptied)))])
    assert ranks.holes(filled) == () == _holes(filled)
    every = ("",) * len(start)  # a job never placed
    assert ranks.holes(every) == tuple(range(len(start)))


def test_ranks_are_a_value_that_knows_its_holes() -> None:
    """A job's ranks: equal to the tuple of the same nodes, immutable, their holes found
    once (held by the value, not by a cache keyed on anything else) and copied with it."""
    import copy
    import pickle

    r = ranks.Ranks(("a", "", "b", ""))
    assert r == ("a", "", "b", "") and hash(r) == hash(("a", "", "b", ""))
    assert r.holes == (1, 3) and r.holes is r.holes
    assert ranks.as_ranks(r) is r and ranks.holes(r) is r.holes
    assert pickle.loads(pickle.dumps(r)).holes == (1, 3) == copy.deepcopy(r).holes
    assert ranks.Ranks(("",) * 3).holes == (0, 1, 2) and ranks.Ranks().holes == ()
