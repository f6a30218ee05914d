"""Golden outputs: the twin's default scenarios give the same ``summary.json`` for the same
seed, byte for byte in every outcome field, before and after a refactor.

The golden files were written by ``mtc sim run`` (``simulator.cli.cmd_run``) before the
simulator was split into modules. Only the ``timings`` block is dropped: it holds
wall-clock seconds (``wall_s``, ``handlers_s``, ``accounting_s``, ``by_service_s``), which vary
from run to run and machine to machine. Everything else (events, failures, interruptions,
repairs, restarts, goodput, the job model's own ledger in ``truth``) must match exactly.

Regenerate (only for an intended behaviour change, and say so in the commit):

    .venv/bin/python -m tests.sim.test_golden
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulator import twin
from simulator.scenario import load_scenario

GOLDEN = Path(__file__).parent / "golden"
SCENARIOS = Path(__file__).resolve().parents[2] / "simulator" / "scenarios"
TIMING_FIELDS = ("timings",)  # wall-clock only: differs run to run
TWO_PARTITIONS = str(GOLDEN.resolve() / "two_partitions.yaml")  # a test scenario, kept here


def summary(scenario_file: str, seed: int) -> dict[str, Any]:
    """What ``mtc sim run <scenario> --seed <seed>`` writes to summary.json, without timings,
    through the same JSON encoding."""
    result = twin.run(load_scenario(SCENARIOS / scenario_file), seed=seed)
    out = result.summary()
    out["truth"] = result.truth
    decoded: dict[str, Any] = json.loads(json.dumps(out, indent=1, default=str))
    return decoded


def golden(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / name).read_text())
    for key in TIMING_FIELDS:
        data.pop(key, None)
    return data


def test_small_seed7_matches_golden() -> None:
    assert summary("small.yaml", 7) == golden("small_seed7_summary.json")


def test_two_partitions_seed5_matches_golden() -> None:
    """Several jobs pending at once, placed by partition with per-partition spares (written
    by the code before scheduling read a projection of the idle nodes)."""
    assert summary(TWO_PARTITIONS, 5) == golden("two_partitions_seed5_summary.json")


@pytest.mark.slow
def test_llama3_seed3_matches_golden() -> None:
    assert summary("llama3.yaml", 3) == golden("llama3_seed3_summary.json")


if __name__ == "__main__":  # pragma: no cover
    for scenario_file, seed in (("small.yaml", 7), ("llama3.yaml", 3), (TWO_PARTITIONS, 5)):
        path = GOLDEN / f"{Path(scenario_file).stem}_seed{seed}_summary.json"
        path.write_text(json.dumps(summary(scenario_file, seed), indent=1, default=str) + "\n")
        print(f"wrote {path}")
