"""A transition table is data: an entity may only move along an edge the table lists."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

from shared.domain.errors import InvalidTransition

S = TypeVar("S", bound=enum.Enum)


class TransitionTable(Generic[S]):
    def __init__(self, entity: str, edges: Mapping[S, frozenset[S]]) -> None:
        self.entity = entity
        self.edges = dict(edges)

    def allowed(self, current: S, target: S) -> bool:
        return target in self.edges.get(current, frozenset())

    def check(self, entity_id: str, current: S, target: S) -> None:
        if not self.allowed(current, target):
            raise InvalidTransition(self.entity, entity_id, str(current.value), str(target.value))

    def all_pairs(self) -> list[tuple[S, S, bool]]:
        """Every (from, to, allowed) pair: the tests walk this to cover refused edges too."""
        states = list(self.edges)
        return [(a, b, self.allowed(a, b)) for a in states for b in states]
