"""The simulator's shape: small modules with one job each, and no import cycles."""

from __future__ import annotations

from pathlib import Path

import grimp

SIMULATOR = Path(__file__).resolve().parents[2] / "simulator"
MAX_LINES = 500


def test_no_simulator_module_is_over_500_lines() -> None:
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines())
             for p in SIMULATOR.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_no_import_cycles_in_the_simulator() -> None:
    graph = grimp.build_graph("simulator", include_external_packages=False)
    modules = sorted(m for m in graph.modules if m != "simulator")
    cycles = [(a, b) for i, a in enumerate(modules) for b in modules[i + 1:]
              if graph.chain_exists(a, b) and graph.chain_exists(b, a)]
    assert cycles == []


def test_adapters_module_is_gone() -> None:
    assert not (SIMULATOR / "adapters.py").exists()
