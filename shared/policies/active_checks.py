"""Active checks on idle nodes, on a budget: which idle nodes to check now. Pure.

A node that idles is a node whose faults nobody sees until a job lands on it (CoreWeave runs a
test on idle nodes every hour for silent data corruption, slowness and heat). Each idle node
gets, every ``interval_s``, a known-answer compute test, a short DCGM diagnostic and a thermal
read (``shared.ports.ActiveChecks``). The budget: never more than ``max_share`` of the idle
nodes under check at once (rounded down: with 10 % and 9 idle nodes, none), so most idle
capacity stays free for the jobs; and a check never delays a job that wants its node (the check
is cancelled at the placement: ``shared.service_layer.active_checks.yield_to_job``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shared.domain.errors import ValidationError


@dataclass(frozen=True)
class ActiveCheckConfig:
    enabled: bool = True
    interval_s: float = 3600.0  # each idle node at most this often
    max_share: float = 0.1  # of the idle nodes under check at once
    dcgm_level: int = 1  # the short diagnostic

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValidationError("active_checks.interval_s", "must be positive")
        if not 0 <= self.max_share <= 1:
            raise ValidationError("active_checks.max_share", "must be between 0 and 1")


@dataclass(frozen=True)
class IdleNode:
    node_id: str
    last_checked_at: float | None  # None: never checked
    checking: bool  # a check is in flight


def budget(idle: int, config: ActiveCheckConfig) -> int:
    """How many idle nodes may be under check at once."""
    return math.floor(idle * config.max_share + 1e-9)


def pick(idle: Sequence[IdleNode], now: float, config: ActiveCheckConfig) -> tuple[str, ...]:
    """The nodes to start checking now: due (never checked, or not for ``interval_s``), the
    longest unchecked first, as many as the budget leaves after the checks in flight."""
    if not config.enabled:
        return ()
    free = budget(len(idle), config) - sum(1 for n in idle if n.checking)
    if free <= 0:
        return ()
    due = [n for n in idle if not n.checking and (
        n.last_checked_at is None or now - n.last_checked_at >= config.interval_s)]
    due.sort(key=lambda n: (n.last_checked_at is not None, n.last_checked_at or 0.0,
                            n.node_id))
    return tuple(n.node_id for n in due[:free])
