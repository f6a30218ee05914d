"""A cluster's team queues (fair share, ``shared.policies.fair_share``): per team and
partition, a nominal quota in nodes and an optional borrowing limit. A job names its team with
the ``mtc-team`` label; a job without one is in the default queue (``default``, which has no
quota unless configured: it only borrows). A cluster without queues schedules as before: no
quota, no preemption.

Parsing is validation: a queue naming an unknown partition, a team that is not a label value,
a pair given twice, or nominal quotas that add up to more than the partition's nodes (a
guarantee no reclaim could keep) is refused naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.domain import validation as kit
from shared.domain.errors import ValidationError

TEAM_LABEL = "mtc-team"
DEFAULT_TEAM = "default"
TEAM = re.compile(r"^[a-z0-9_-]{1,63}$")  # a label value: what a job's mtc-team may say
MAX_QUEUES = 256


@dataclass(frozen=True)
class QueueSpec:
    team: str
    partition: str
    nominal_nodes: int
    borrowing_limit_nodes: int | None = None  # None: it may borrow whatever is idle

    @classmethod
    def parse(cls, value: Any, path: str) -> QueueSpec:
        data = kit.mapping(value, path, noun="an object")
        kit.only_keys(data, path, ("team", "partition", "nominalNodes", "borrowingLimitNodes"))
        team = kit.string(data, "team", path)
        partition = kit.string(data, "partition", path)
        assert team is not None and partition is not None
        if not TEAM.match(team):
            raise ValidationError(kit.join(path, "team"), "a team is a label value: 1-63 "
                                  f"lowercase letters, digits, '_' or '-'; got {team!r}")
        nominal = kit.int_field(data, "nominalNodes", path, minimum=0)
        limit = kit.field(data, "borrowingLimitNodes", path, int, required=False)
        if limit is not None:
            limit = kit.integer(limit, kit.join(path, "borrowingLimitNodes"), low=0)
        return cls(team, partition, nominal, limit)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"team": self.team, "partition": self.partition,
                               "nominalNodes": self.nominal_nodes}
        if self.borrowing_limit_nodes is not None:
            out["borrowingLimitNodes"] = self.borrowing_limit_nodes
        return out


def parse(value: Any, path: str, partition_nodes: Mapping[str, int]) -> tuple[QueueSpec, ...]:
    """``partition_nodes``: the worker nodes each partition has (spares left out: they only
    stand in for failed nodes)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValidationError(path, "must be a list")
    if len(value) > MAX_QUEUES:
        raise ValidationError(path, f"at most {MAX_QUEUES} queues, got {len(value)}")
    out = tuple(QueueSpec.parse(item, kit.join(path, i)) for i, item in enumerate(value))
    check(out, path, partition_nodes)
    return out


def check(queues: Sequence[QueueSpec], path: str, partition_nodes: Mapping[str, int]) -> None:
    seen: set[tuple[str, str]] = set()
    nominal: dict[str, int] = {}
    for i, q in enumerate(queues):
        where = kit.join(path, i)
        if q.partition not in partition_nodes:
            raise ValidationError(kit.join(where, "partition"),
                                  f"names no partition of the cluster ({q.partition!r})")
        if (q.team, q.partition) in seen:
            raise ValidationError(kit.join(where, "team"), f"team {q.team!r} has a queue on "
                                  f"{q.partition!r} already")
        seen.add((q.team, q.partition))
        nominal[q.partition] = nominal.get(q.partition, 0) + q.nominal_nodes
        if nominal[q.partition] > partition_nodes[q.partition]:
            raise ValidationError(kit.join(where, "nominalNodes"), "the nominal quotas on "
                                  f"{q.partition!r} add up to {nominal[q.partition]} nodes, "
                                  f"more than its {partition_nodes[q.partition]} worker nodes")


def team_of(labels: Mapping[str, str]) -> str:
    return labels.get(TEAM_LABEL) or DEFAULT_TEAM
