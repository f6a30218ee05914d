"""A job's nodes by rank, worked on with set operations.

``Job.node_ids`` holds a node per rank ('' for a rank whose node was lost). A restart of a
2,048-node job touches a handful of them; a Python loop over every rank, several times per
restart, was a large share of the twin's time and of a production restart's. These helpers
find the few in C (set operations, ``list.index``) and keep the rank order the loops had;
:class:`Ranks` is the value a job holds, which knows its holes.
"""

from __future__ import annotations

import bisect
import functools
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


class Ranks(tuple[str, ...]):
    """A job's node per rank ('' for a rank without one): an immutable value that knows its
    holes (found once, when first asked: a restart asks whether there are any, how many per
    pool and where). Equal to the plain tuple of the same nodes."""

    @functools.cached_property
    def holes(self) -> tuple[int, ...]:
        """The ranks without a node, in order."""
        if not any(self):  # every rank (a job not placed yet)
            return tuple(range(len(self)))
        found = []
        at = -1
        try:
            while True:  # one scan in C, stopping at each hole
                at = self.index("", at + 1)
                found.append(at)
        except ValueError:
            pass
        return tuple(found)


def as_ranks(node_ids: Iterable[str]) -> Ranks:
    """``node_ids`` as :class:`Ranks` (itself when it is one already)."""
    return node_ids if type(node_ids) is Ranks else Ranks(node_ids)


def holes(node_ids: Sequence[str]) -> tuple[int, ...]:
    """The ranks of ``node_ids`` without a node ('' there), in order."""
    return as_ranks(node_ids).holes


def holes_in(node_ids: Sequence[str], first: int, count: int) -> int:
    """How many of the ranks ``first`` .. ``first + count - 1`` have no node (a pool's)."""
    at = holes(node_ids)
    return bisect.bisect_left(at, first + count) - bisect.bisect_left(at, first)


def with_holes(node_ids: Sequence[str], gone: Set[str]) -> Ranks:
    """``node_ids`` with the ranks of ``gone`` emptied (a new value when any is)."""
    if not gone:
        return as_ranks(node_ids)
    if len(gone) > SMALL:
        return Ranks("" if n in gone else n for n in node_ids)
    out: list[str] | None = None
    for node_id in gone:
        if node_id:
            try:
                at = node_ids.index(node_id)
            except ValueError:
                continue
            if out is None:
                out = list(node_ids)
            out[at] = ""
    return as_ranks(node_ids) if out is None else Ranks(out)


def fill_holes(node_ids: Sequence[str], placed: Iterable[str]) -> Ranks:
    """``node_ids`` with its holes filled in rank order by ``placed`` (a new value); a
    ValueError when ``placed`` has more or fewer nodes than there are holes."""
    ranks = as_ranks(node_ids)
    at = ranks.holes
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
    return Ranks(out)
