"""`mtc node list` shows a RACK column when the nodes have racks (docs/racks.md), and the
table it showed before when none has."""

from __future__ import annotations

from services.cli.commands_api import node_table

NODE = {"partition": "gpu", "nodeId": "c1-gpu-000", "state": "idle", "spare": False}


def headers(nodes: list[dict[str, object]]) -> list[str]:
    return [str(c.header) for c in node_table(nodes).columns]


def test_a_rack_column_only_when_some_node_has_a_rack() -> None:
    assert "RACK" not in headers([NODE])
    assert headers([NODE, {**NODE, "rack": "gpu-rack-0"}])[:3] == ["PARTITION", "RACK", "NODE"]
    table = node_table([{**NODE, "rack": "gpu-rack-0"}])
    assert list(table.columns[1].cells) == ["gpu-rack-0"]
