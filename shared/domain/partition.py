"""The per-partition aggregate the blast-radius guard reads (split out of ``model``, which
re-exports it): counts and the ids taken out, without scanning every node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Partition:
    """Per-partition aggregate the blast-radius guard reads without scanning every node.

    ``out_of_service`` holds the nodes taken out (repairs, replacements); ``settling`` counts
    the nodes still coming up for the first time, which are not in service either but need
    no ids here: a 16k-node partition coming up would otherwise rewrite a 16k-id document
    for every node that enters service. ``down`` is what the blast-radius guard counts."""

    cluster_id: str
    name: str
    total_nodes: int = 0
    out_of_service: set[str] = field(default_factory=set)
    removed_at: list[float] = field(default_factory=list)
    settling: int = 0
    # racks drained as one (shared.policies.domains): rack -> its nodes not back in service;
    # state, so a redelivered diagnosis neither drains nor alerts twice
    drained_domains: dict[str, list[str]] = field(default_factory=dict)
    held_domains: list[str] = field(default_factory=list)  # racks the domain guard held

    @property
    def key(self) -> str:
        return partition_key(self.cluster_id, self.name)

    def take_out(self, node_id: str, now: float, window_s: float) -> None:
        if node_id not in self.out_of_service:
            self.out_of_service.add(node_id)
            self.removed_at = [t for t in self.removed_at if t >= now - window_s] + [now]

    def put_back(self, node_id: str) -> None:
        self.out_of_service.discard(node_id)
        for domain, members in list(self.drained_domains.items()):
            if node_id in members:
                members.remove(node_id)
                if not members:  # every node of the rack is back: the rack is whole again
                    del self.drained_domains[domain]
                    self.held_domains.clear()  # (and a held rack may be drained next time)

    def drain_domain(self, domain: str, node_ids: list[str]) -> bool:
        """Record ``domain`` drained as one; False when it already was (no second alert)."""
        if domain in self.drained_domains:
            return False
        self.drained_domains[domain] = sorted(node_ids)
        if domain in self.held_domains:
            self.held_domains.remove(domain)
        return True

    def hold_domain(self, domain: str) -> bool:
        """Record ``domain`` held by the guard per domain; False when it already was."""
        if domain in self.held_domains:
            return False
        self.held_domains.append(domain)
        return True

    def drained_node_ids(self) -> frozenset[str]:
        """The nodes of racks drained as one: counted per rack, not per node."""
        return frozenset(n for members in self.drained_domains.values() for n in members)

    @property
    def down(self) -> int:
        """Nodes not in service: taken out, or still coming up."""
        return len(self.out_of_service) + self.settling

    def entered_service(self, node_id: str) -> None:
        """A node passed its checks: out of the taken-out set, or one fewer coming up."""
        if node_id in self.out_of_service:
            self.put_back(node_id)
        elif self.settling > 0:
            self.settling -= 1

    def set_out_of_service(self, node_ids: set[str]) -> None:
        self.out_of_service = set(node_ids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "name": self.name,
            "total_nodes": self.total_nodes,
            "out_of_service": sorted(self.out_of_service),
            "removed_at": list(self.removed_at),
            "settling": self.settling,
            "drained_domains": {k: list(v) for k, v in self.drained_domains.items()},
            "held_domains": list(self.held_domains),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Partition:
        return cls(cluster_id=d["cluster_id"], name=d["name"],
                   total_nodes=d.get("total_nodes", 0),
                   out_of_service=set(d.get("out_of_service", ())),
                   removed_at=list(d.get("removed_at", ())), settling=d.get("settling", 0),
                   drained_domains={k: list(v) for k, v in
                                    (d.get("drained_domains") or {}).items()},
                   held_domains=list(d.get("held_domains") or ()))


def partition_key(cluster_id: str, name: str) -> str:
    return f"{cluster_id}:{name}"
