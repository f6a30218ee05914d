"""``python -m simulator`` / ``mtc sim``: run and sweep write what they promise."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from simulator import cli

SMALL = Path(__file__).resolve().parents[2] / "simulator" / "scenarios" / "small.yaml"


def test_add_parser_plugs_into_a_parent_cli() -> None:
    parser = argparse.ArgumentParser(prog="mtc")
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    args = parser.parse_args(["sim", "sweep", "x.yaml", "--vary", "spares=0,4",
                              "--replications", "3"])
    assert args.func is cli.cmd_sweep and args.vary == ["spares=0,4"]
    assert args.replications == 3


@pytest.mark.slow
def test_run_prints_the_table_and_writes_the_plot(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", str(SMALL), "--set", "duration=2d", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "Goodput per job" in out and "WASTED_PROGRESS_FROM_DISRUPTION" in out
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["scenario"] == "small" and 0 < summary["job:train"]["goodput"] < 1


def test_run_json_is_reproducible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for _ in range(2):
        assert cli.main(["run", str(SMALL), "--set", "duration=1d", "--json", "--no-plot",
                         "--out", str(tmp_path)]) == 0
        data = json.loads(capsys.readouterr().out)
        data.pop("timings")
        outs.append(data)
    assert outs[0] == outs[1]


def test_a_bad_override_names_the_key(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", str(SMALL), "--set", "jobs.0.checkpoint_intervall=5m",
                     "--out", str(tmp_path)]) == 2
    assert "jobs[0].checkpoint_intervall: unknown key" in capsys.readouterr().out


@pytest.mark.slow
def test_sweep_on_two_processes_writes_csv_json_and_plots(tmp_path: Path) -> None:
    code = cli.main(["sweep", str(SMALL), "--set", "duration=1d", "--vary",
                     "checkpoint_interval=10m,60m", "--vary", "spares=0,4",
                     "--replications", "2", "--processes", "2", "--out", str(tmp_path)])
    assert code == 0
    with (tmp_path / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and all(r["n"] == "2" for r in rows)
    assert {"goodput", "goodput_ci", "ettr_ci"} <= set(rows[0])
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert len(runs) == 8
    # common random numbers: replication r sees the same seed at every grid point
    assert {r["seed"] for r in runs if r["replication"] == 1} == {2}
    assert (tmp_path / "sweep_checkpoint_interval.png").exists()
    assert (tmp_path / "sweep_spares.png").exists()
