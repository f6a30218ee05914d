"""``mtc sim run`` and ``sweep`` print every header and number whole at any width: boxed where
the table fits, stacked ``name: value`` blocks where it does not, ``--json`` unchanged."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from simulator import layout, report, twin
from simulator.scenario import load_scenario

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "simulator" / "scenarios" / "small.yaml"
ELLIPSIS = "…"


@pytest.fixture(scope="module")
def result() -> twin.RunResult:
    spot = {"mode": "spot", "price_per_node_hour": 30.0,
            "spot": {"preemptions_per_node_day": 0.2}}
    return twin.run(load_scenario(SMALL, {"duration": "2d", "availability": spot}))


def _printed(result: twin.RunResult, width: int) -> str:
    buf = io.StringIO()
    report.print_run(result, Console(file=buf, width=width, force_terminal=False,
                                     color_system=None))
    return buf.getvalue()


def _whole(text: str, cell: str) -> bool:
    """``cell`` appears with no letter, digit or dot glued on either side."""
    return re.search(rf"(?<![\w.]){re.escape(cell)}(?![\w.])", text) is not None


@pytest.mark.parametrize("width", [40, 80, 200])
def test_every_header_and_number_is_whole(result: twin.RunResult, width: int) -> None:
    text = _printed(result, width)
    assert ELLIPSIS not in text
    grids = report.run_grids(result)
    assert sum(len(g.rows) for g in grids) > 10
    assert grids[-1].title == "Capacity and cost (spot)"
    for grid in grids:
        assert grid.title in text
        for header in grid.headers:
            assert _whole(text, header), (width, header)
        for row in grid.rows:
            for cell in row:
                assert not cell or _whole(text, cell), (width, grid.title, cell)
    # the figures are the run's: the job's goodput as a percentage, its restarts
    job = result.job()
    assert _whole(text, f"{100 * job.goodput:.1f}%")
    # ETTR is defined where it is printed
    assert "ETTR (effective training time ratio)" in " ".join(text.split())
    if width >= 120:  # the goodput table fits: one boxed row per job
        assert re.search(r"│ train\s+│\s+64 │", text)
    else:
        assert "  goodput: " in text and "  state: " in text


def test_stacked_blocks_keep_long_values_on_their_own_line() -> None:
    grid = layout.Grid("t", ("what", "value"))
    grid.add("x", "a-value-that-is-longer-than-the-console-is-wide")
    lines = layout.stacked(grid, 20)
    assert lines == ["t", "  what: x", "    value:",
                     "      a-value-that-is-longer-than-the-console-is-wide"]
    assert grid.boxed_width() == len("│ what │ a-value-that-is-longer-than-the-console-is-wide │")


@pytest.mark.slow
def test_a_pipe_at_80_columns_gets_whole_values_and_json_stays_machine_form(
        tmp_path: Path) -> None:
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "simulator", "run", str(SMALL), "--set", "duration=1d",
            "--out", str(tmp_path), "--no-plot"]
    text = subprocess.run(args, env=env, capture_output=True, text=True, check=True,
                          timeout=120).stdout
    assert ELLIPSIS not in text
    for word in ("sched", "runtime", "program", "goodput", "ETTR", "restarts", "state",
                 "RUNNING"):
        assert _whole(text, word), word
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert _whole(text, f"{100 * summary['job:train']['goodput']:.1f}%")
    assert max(len(line) for line in text.splitlines()) <= 80
    data = json.loads(subprocess.run([*args, "--json"], env=env, capture_output=True,
                                     text=True, check=True, timeout=120).stdout)
    assert data["job:train"]["goodput"] == summary["job:train"]["goodput"]


def test_the_sweep_table_is_whole_at_40_columns() -> None:
    summary = [{"spares": "16", "n": 2, **{m: 0.123456 for m in report.SWEEP_METRICS},
                **{f"{m}_ci": 0.0456 for m in report.SWEEP_METRICS}}]
    grid = report.sweep_grid(summary, ["spares"], "small: mean over 2 replications (95% CI)")
    buf = io.StringIO()
    layout.render(Console(file=buf, width=40, color_system=None), grid)
    text = buf.getvalue()
    assert "  spares: 16" in text and "    goodput: 0.123 ± 0.046" in text
    assert ELLIPSIS not in text


def test_the_box_is_used_exactly_when_rich_can_print_it_whole() -> None:
    grid = layout.Grid("Goodput per job", ("job", "goodput", "state"))
    grid.add("train", "91.2%", "RUNNING")
    grid.add("fleet", "88.0%", "")
    need = grid.boxed_width()
    for width, boxed in ((need, True), (need - 1, False)):
        buf = io.StringIO()
        layout.render(Console(file=buf, width=width, color_system=None), grid)
        text = buf.getvalue()
        assert ("│ train │   91.2% │ RUNNING │" in text) is boxed, text
        assert max(len(line) for line in text.splitlines()) <= width
        assert all(_whole(text, c) for c in ("91.2%", "88.0%", "RUNNING", "goodput"))
