"""A node pool's physical topology: which rack, NVLink domain and switch each node sits in.

Racks fail as a unit (a power shelf, a top-of-rack switch, a GB200 NVL72's NVLink switch
tray), so the placement packs a gang into the fewest NVLink domains, and the repair service
guards and drains per rack as well as per partition. A pool without a topology has none
(every field ""), and everything behaves as before topology existed.

The pool spec takes it as an mtc extension field (``topology`` on a node pool here,
``mtcTopology`` on the Vertex-shaped wire, beside ``mtcHotSpareCount``), in one of two forms:

- generated: ``{"nodesPerRack": 4, "racksPerSwitch": 2}``: node i of the pool is in rack
  ``<pool>-rack-<i // nodesPerRack>``; its NVLink domain is its rack (one NVLink domain per
  rack, as on an NVL72) unless ``nodesPerNvlinkDomain`` says otherwise;
- explicit: ``{"nodes": [{"rack": "r1", "nvlinkDomain": "r1", "switch": "s1"}, ...]}``, one
  entry per node index of the pool (what an inventory export gives).

``spareLayout`` says where the pool's ``spareCount`` hot spares sit: ``perPartition`` (the
pool's last nodes, today's layout) or ``perRack`` (spread round-robin over the racks, the
last node of each rack first), the question ``mtc sim sweep`` answers (docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain import validation as kit
from shared.domain.errors import ValidationError

SPARE_LAYOUTS = ("perPartition", "perRack")
MAX_EXPLICIT_NODES = 100_000


@dataclass(frozen=True)
class Place:
    """Where one node sits ("" = unknown)."""

    rack: str = ""
    nvlink_domain: str = ""
    switch: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"rack": self.rack, "nvlinkDomain": self.nvlink_domain, "switch": self.switch}


NOWHERE = Place()


@dataclass(frozen=True)
class Topology:
    nodes_per_rack: int = 0  # 0: no generated layout
    racks_per_switch: int = 0
    nodes_per_nvlink_domain: int = 0  # 0: the rack is the NVLink domain
    nodes: tuple[Place, ...] = ()  # explicit layout by node index (wins over the generated)
    spare_layout: str = "perPartition"

    @classmethod
    def parse(cls, value: Any, path: str) -> Topology:
        data = kit.mapping(value, path, noun="an object")
        kit.only_keys(data, path, ("nodesPerRack", "racksPerSwitch", "nodesPerNvlinkDomain",
                                   "nodes", "spareLayout"))
        per_rack = kit.int_field(data, "nodesPerRack", path, required=False, minimum=1,
                                 maximum=MAX_EXPLICIT_NODES)
        per_switch = kit.int_field(data, "racksPerSwitch", path, required=False, minimum=1,
                                   maximum=MAX_EXPLICIT_NODES)
        per_nvl = kit.int_field(data, "nodesPerNvlinkDomain", path, required=False, minimum=1,
                                maximum=MAX_EXPLICIT_NODES)
        nodes = kit.list_field(data, "nodes", path, _parse_place, required=False,
                               non_empty=False)
        layout = kit.string(data, "spareLayout", path, required=False) or "perPartition"
        if layout not in SPARE_LAYOUTS:
            raise ValidationError(kit.join(path, "spareLayout"),
                                  f"must be one of {list(SPARE_LAYOUTS)}, got {layout!r}")
        if not per_rack and not nodes:
            raise ValidationError(kit.join(path, "nodesPerRack"),
                                  "is required unless nodes lists every node's place")
        if (per_switch or per_nvl) and not per_rack:
            raise ValidationError(kit.join(path, "nodesPerRack"),
                                  "is required with racksPerSwitch or nodesPerNvlinkDomain")
        return cls(per_rack, per_switch, per_nvl, tuple(nodes), layout)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spareLayout": self.spare_layout}
        for key, value in (("nodesPerRack", self.nodes_per_rack),
                           ("racksPerSwitch", self.racks_per_switch),
                           ("nodesPerNvlinkDomain", self.nodes_per_nvlink_domain)):
            if value:
                out[key] = value
        if self.nodes:
            out["nodes"] = [p.to_dict() for p in self.nodes]
        return out

    def check(self, node_count: int, path: str) -> None:
        """An explicit layout names every node of the pool."""
        if self.nodes and len(self.nodes) != node_count:
            raise ValidationError(kit.join(path, "nodes"), f"must list {node_count} nodes "
                                  f"(the pool's nodeCount), got {len(self.nodes)}")


def _parse_place(value: Any, path: str) -> Place:
    data: Mapping[str, Any] = kit.mapping(value, path, noun="an object")
    kit.only_keys(data, path, ("rack", "nvlinkDomain", "switch"))
    rack = kit.string(data, "rack", path) or ""
    nvl = kit.string(data, "nvlinkDomain", path, required=False) or rack
    switch = kit.string(data, "switch", path, required=False) or ""
    return Place(rack, nvl, switch)


def place_of(topology: Topology | None, pool_id: str, index: int) -> Place:
    """Where node ``index`` of the pool sits (NOWHERE without a topology)."""
    if topology is None:
        return NOWHERE
    if topology.nodes:
        return topology.nodes[index] if index < len(topology.nodes) else NOWHERE
    rack_no = index // topology.nodes_per_rack
    rack = f"{pool_id}-rack-{rack_no}"
    nvl = rack if not topology.nodes_per_nvlink_domain \
        else f"{pool_id}-nvl-{index // topology.nodes_per_nvlink_domain}"
    switch = f"{pool_id}-sw-{rack_no // topology.racks_per_switch}" \
        if topology.racks_per_switch else ""
    return Place(rack, nvl, switch)


def spare_indices(topology: Topology | None, pool_id: str, node_count: int,
                  spare_count: int) -> frozenset[int]:
    """Which node indices of the pool are hot spares: the last ``spare_count`` (per
    partition), or spread over the racks, each rack's last node first (per rack)."""
    if spare_count <= 0:
        return frozenset()
    if topology is None or topology.spare_layout == "perPartition":
        return frozenset(range(node_count - spare_count, node_count))
    racks: dict[str, list[int]] = {}
    for index in range(node_count):
        racks.setdefault(place_of(topology, pool_id, index).rack, []).append(index)
    columns = [list(reversed(members)) for members in racks.values()]
    chosen: list[int] = []
    depth = 0
    while len(chosen) < spare_count:
        for column in columns:
            if depth < len(column) and len(chosen) < spare_count:
                chosen.append(column[depth])
        depth += 1
    return frozenset(chosen)
