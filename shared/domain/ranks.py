"""A job's nodes by rank, worked on with set operations.

``Job.node_ids`` holds a node per rank ('' for a rank whose node was lost). A restart of a
2,048-node job touches a handful of them; a Python loop over every rank, several times per
restart, was a large share of the twin's time and of a production restart's. These helpers
find the few in C (set operations, ``list.index``) and keep the rank order the loops had.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence, Set

SMALL = 32  # up to this many, ``list.index`` per member beats one pass over every rank


def in_rank_order(subset: Set[str], node_ids: Sequence[str]) -> list[str]:
    """The members of ``subset`` (each holding a rank in ``node_ids``, whose nodes are
    unique) in rank order."""
    if not subset:
        return []
    if len(subset) <= SMALL:
        return sorted(subset, key=node_ids.index)
    return [n for n in node_ids if n in subset]


def holes(node_ids: tuple[str, ...]) -> tuple[int, ...]:
    """The ranks of ``node_ids`` without a node ('' there), in order.

    Remembered for the last few rank tuples by identity (a job's tuple is shared with its
    document, and a restart asks of the same tuple whether it has holes, how many per pool
    and where: each a pass over 2,048 ranks); the tuples made here are remembered as made.
    """
    held = _HOLES.get(id(node_ids))
    if held is not None and held[0] is node_ids:
        return held[1]
    if not any(node_ids):  # every rank (a job not placed yet): no scan per hole
        return _remember(node_ids, tuple(range(len(node_ids))))
    found = []
    at = -1
    try:
        while True:  # (in C: one scan, stopping at each hole)
            at = node_ids.index("", at + 1)
            found.append(at)
    except ValueError:
        pass
    return _remember(node_ids, tuple(found))


def holes_in(node_ids: tuple[str, ...], first: int, count: int) -> int:
    """How many of the ranks ``first`` .. ``first + count - 1`` have no node (a pool's)."""
    at = holes(node_ids)
    return bisect.bisect_left(at, first + count) - bisect.bisect_left(at, first)


def _remember(node_ids: tuple[str, ...], at: tuple[int, ...]) -> tuple[int, ...]:
    if len(_HOLES) >= _KEEP:
        _HOLES.pop(next(iter(_HOLES), -1), None)  # the oldest (a race only forgets more)
    _HOLES[id(node_ids)] = (node_ids, at)  # (the tuple is held: its id is not reused)
    return at


_KEEP = 64  # rank tuples whose holes are remembered
_HOLES: dict[int, tuple[tuple[str, ...], tuple[int, ...]]] = {}


def with_holes(node_ids: Sequence[str], gone: Set[str]) -> tuple[str, ...]:
    """``node_ids`` with the ranks of ``gone`` emptied (a new tuple when any is)."""
    if not gone:
        return tuple(node_ids)
    if len(gone) > SMALL:
        return tuple("" if n in gone else n for n in node_ids)
    out: list[str] | None = None
    emptied = []
    for node_id in gone:
        if node_id:
            try:
                at = node_ids.index(node_id)
            except ValueError:
                continue
            if out is None:
                out = list(node_ids)
            out[at] = ""
            emptied.append(at)
    if out is None:
        return tuple(node_ids)
    made = tuple(out)
    if type(node_ids) is tuple:  # its holes, and the ones made here
        _remember(made, tuple(sorted((*holes(node_ids), *emptied))))
    return made


def fill_holes(node_ids: Sequence[str], placed: Iterable[str]) -> tuple[str, ...]:
    """``node_ids`` with its holes filled in rank order by ``placed`` (a new tuple); a
    ValueError when ``placed`` has more or fewer nodes than there are holes."""
    ranks = tuple(node_ids)
    at = holes(ranks)
    nodes = list(placed)
    if len(nodes) > len(at):
        raise ValueError(f"more placed nodes than holes: {nodes[len(at)]!r} has no rank")
    if len(nodes) < len(at):
        raise ValueError(f"{len(at) - len(nodes)} ranks left without a node")
    if not at:
        return ranks
    out = list(ranks)
    for rank, node_id in zip(at, nodes, strict=True):
        out[rank] = node_id
    made = tuple(out)
    if all(nodes):  # every hole filled (a '' placed stays a hole: holes() finds it)
        _remember(made, ())
    return made
