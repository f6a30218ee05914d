"""A node pool's topology: parsing, where each node sits, where spares go."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.errors import ValidationError
from shared.domain.specs import ClusterSpec, NodePoolSpec
from shared.domain.topology import NOWHERE, Place, Topology, place_of, spare_indices

MACHINE = {"machineType": "a3-highgpu-8g"}


def pool(count: int = 8, spares: int = 0, **topology: Any) -> NodePoolSpec:
    return NodePoolSpec.parse({"id": "p", "machineSpec": MACHINE, "nodeCount": count,
                               "spareCount": spares, "topology": topology}, "nodePools[0]")


def test_a_generated_layout_names_racks_nvlink_domains_and_switches() -> None:
    topo = pool(8, nodesPerRack=4, racksPerSwitch=2, nodesPerNvlinkDomain=2).topology
    assert place_of(topo, "p", 0) == Place("p-rack-0", "p-nvl-0", "p-sw-0")
    assert place_of(topo, "p", 5) == Place("p-rack-1", "p-nvl-2", "p-sw-0")
    rack_only = pool(8, nodesPerRack=4).topology
    assert place_of(rack_only, "p", 5) == Place("p-rack-1", "p-rack-1", "")
    assert place_of(None, "p", 5) is NOWHERE


def test_an_explicit_layout_lists_every_node() -> None:
    topo = pool(2, nodes=[{"rack": "r1", "switch": "s"}, {"rack": "r2", "nvlinkDomain": "n"}]
                ).topology
    assert place_of(topo, "p", 0) == Place("r1", "r1", "s")
    assert place_of(topo, "p", 1) == Place("r2", "n", "")


@pytest.mark.parametrize(("layout", "spares", "expected"), [
    ("perPartition", 3, [9, 10, 11]),  # the pool's last nodes: all in the last rack
    ("perRack", 3, [3, 7, 11]),  # each rack's last node
    ("perRack", 4, [2, 3, 7, 11]),  # round-robin: rack 0 gets a second one
    ("perRack", 0, []),
])
def test_spares_per_partition_or_per_rack(layout: str, spares: int,
                                          expected: list[int]) -> None:
    spec = pool(12, spares, nodesPerRack=4, spareLayout=layout)
    assert sorted(spare_indices(spec.topology, "p", 12, spares)) == expected


@pytest.mark.parametrize(("topology", "field"), [
    ({}, "nodePools[0].topology.nodesPerRack"),
    ({"nodesPerRack": 0}, "nodePools[0].topology.nodesPerRack"),
    ({"racksPerSwitch": 2}, "nodePools[0].topology.nodesPerRack"),
    ({"nodesPerRack": 4, "spareLayout": "perRow"}, "nodePools[0].topology.spareLayout"),
    ({"nodesPerRack": 4, "bogus": 1}, "nodePools[0].topology.bogus"),
    ({"nodes": [{"rack": "r"}]}, "nodePools[0].topology.nodes"),
    ({"nodes": [{"switch": "s"}] * 8}, "nodePools[0].topology.nodes[0].rack"),
])
def test_bad_topologies_name_the_field(topology: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        pool(8, **topology)
    assert err.value.path == field


def test_the_spec_round_trips_with_and_without_a_topology() -> None:
    body = {"clusterId": "c", "nodePools": [
        {"id": "a", "machineSpec": MACHINE, "nodeCount": 4, "spareCount": 1,
         "topology": {"nodesPerRack": 2, "spareLayout": "perRack"}},
        {"id": "b", "machineSpec": MACHINE, "nodeCount": 2, "spareCount": 0}]}
    spec = ClusterSpec.parse(body)
    again = ClusterSpec.parse(spec.to_dict())
    assert again == spec
    assert spec.node_pools[0].topology == Topology(2, spare_layout="perRack")
    assert "topology" not in spec.to_dict()["nodePools"][1]
