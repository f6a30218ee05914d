"""A job's nodes by rank, worked on with set operations.

``Job.node_ids`` holds a node per rank ('' for a rank whose node was lost). A restart of a
2,048-node job touches a handful of them; a Python loop over every rank, several times per
restart, was a large share of the twin's time and of a production restart's. These helpers
find the few in C (set operations, ``list.index``) and keep the rank order the loops had.
"""

from __future__ import annotations

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


def with_holes(node_ids: Sequence[str], gone: Set[str]) -> tuple[str, ...]:
    """``node_ids`` with the ranks of ``gone`` emptied (a new tuple when any is)."""
    if not gone:
        return tuple(node_ids)
    if len(gone) > SMALL:
        return tuple("" if n in gone else n for n in node_ids)
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
    return tuple(node_ids) if out is None else tuple(out)


def fill_holes(node_ids: Sequence[str], placed: Iterable[str]) -> tuple[str, ...]:
    """``node_ids`` with its holes filled in rank order by ``placed`` (a new tuple); a
    ValueError when ``placed`` has more or fewer nodes than there are holes."""
    out = list(node_ids)
    at = 0
    for node_id in placed:
        try:
            at = out.index("", at)
        except ValueError:
            raise ValueError(f"more placed nodes than holes: {node_id!r} has no rank") from None
        out[at] = node_id
    try:  # the holes before ``at`` were filled in order: only the ranks after it can hold one
        out.index("", at)
    except ValueError:
        return tuple(out)
    raise ValueError(f"{out.count('')} ranks left without a node")
