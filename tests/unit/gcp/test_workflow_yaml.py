"""Every workflow YAML is valid Cloud Workflows syntax (the public JSON Schema) and keeps to
the subset that also runs on workflows-emulator (see docs/gcp.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = ROOT / "workflows" / "schema" / "workflows.schema.json"
FILES = sorted((ROOT / "workflows").glob("*.workflows.yaml"))


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_there_is_a_provisioning_workflow() -> None:
    assert ROOT / "workflows" / "provision_cluster.workflows.yaml" in FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_valid_against_the_public_schema(path: Path) -> None:
    jsonschema.validate(load(path), json.loads(SCHEMA.read_text()))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_expressions_avoid_what_the_emulator_cannot_evaluate(path: Path) -> None:
    for where, value in walk(load(path)):
        if not isinstance(value, str):
            continue
        for expr in re.findall(r"\$\{(.*?)\}(?=$|[^}])", value):
            bare = re.sub(r'"[^"]*"', '""', expr)  # ignore string literals
            assert not re.search(r"\b(true|false|null)\b", bare), f"{where}: literal in {expr}"
            assert "{" not in bare, f"{where}: map literal in {expr}"
            assert not re.search(r"\bif\(", bare), f"{where}: if() is a Python keyword there"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_switch_branches_end_and_retries_use_initial_delay(path: Path) -> None:
    for where, value in walk(load(path)):
        if isinstance(value, dict) and "switch" in value:
            for i, branch in enumerate(value["switch"]):
                assert {"next", "return", "raise"} & set(branch), \
                    f"{where}.switch[{i}] must end with next/return/raise (the emulator runs " \
                    "every true condition)"
        if isinstance(value, dict) and "retry" in value and isinstance(value["retry"], dict):
            backoff = value["retry"].get("backoff", {})
            if backoff:
                assert backoff.get("initial_delay") == 1, f"{where}: the emulator reads `delay`"
                assert isinstance(backoff.get("multiplier"), int), f"{where}: integer multiplier"


def test_the_provisioning_workflow_only_sequences_step_endpoints() -> None:
    from services.provisioning.steps_api import STEPS

    text = (ROOT / "workflows" / "provision_cluster.workflows.yaml").read_text()
    used = set(re.findall(r'"/steps/([a-z_]+)"', text))
    assert used == set(STEPS)  # every step is used, and only real ones
    http = [v for _, v in walk(load(ROOT / "workflows" / "provision_cluster.workflows.yaml"))
            if isinstance(v, dict) and v.get("call", "").startswith("http.")]
    assert http and all(v["args"]["url"] == "${base + path}" for v in http)
