"""The twin's output a reader can trust: goodput's parts add up on screen,
intervals stay inside what the quantity allows and say when they are wide, ``plan-spares``
searches around the scenario's own spares and shows progress when piped."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from shared.policies.triage_table import DEFAULT_TABLE_PATH
from simulator import advice, cli, fitted, replay, report, spares, stats, twin
from simulator import fit as fitting
from simulator.scenario import load_scenario, parse_scenario
from tests.sim.conftest import xid79_raw

SMALL = Path(__file__).resolve().parents[2] / "simulator" / "scenarios" / "small.yaml"


@pytest.fixture(scope="module")
def result() -> twin.RunResult:
    return twin.run(load_scenario(SMALL, {"duration": "1d"}))


def test_goodput_parts_add_up_to_the_goodput_with_the_program_line(
        result: twin.RunResult) -> None:
    job = result.job()
    parts = dict(report.goodput_parts(job))
    assert parts["job time"] == 1.0
    subtracted = [v for k, v in parts.items() if k.startswith("- ")]
    assert math.isclose(1.0 + sum(subtracted), job.goodput, abs_tol=1e-9)
    assert math.isclose(parts["= productive (ETTR)"], job.ettr, abs_tol=1e-9)
    # small.yaml's MFU is below 1: the program's gap is a line of its own, and it is the gap
    assert parts["- program (MFU, slow steps)"] < -0.1
    buf = io.StringIO()
    report.print_run(result, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "program (MFU, slow steps)" in text
    assert f"{100 * job.goodput:.1f}%" in text


def test_intervals_are_clamped_to_what_the_quantity_allows() -> None:
    # two replications: t = 12.7, a goodput of 0.36 ± 0.45 would reach below 0
    low, high = stats.clamped(0.36, 0.45, "goodput")
    assert low == 0.0 and high == pytest.approx(0.81)
    low, high = stats.clamped(0.9, 0.3, "ettr")
    assert low == pytest.approx(0.6) and high == 1.0
    assert stats.clamped(2.0, 5.0, "interruptions")[0] == 0.0
    text = stats.interval_text(0.36, 0.45, "goodput", n=2)
    assert text == "0.360 [0.000, 0.810] (n=2: wide)"
    assert stats.interval_text(0.36, 0.01, "goodput", n=20) == "0.360 ± 0.010"
    below, above = stats.error_bars([0.36, 0.9], [0.45, 0.3], "goodput")
    assert below == [pytest.approx(0.36), pytest.approx(0.3)]  # the bar stops at 0
    assert above == [pytest.approx(0.45), pytest.approx(0.1)]  # and at 100%
    out = {"written_interval_s": [1800.0], "advised_range_s": (900.0, 1200.0),
           "advised_interval_s": 1000.0, "replications": 3, "goodput_as_written": 0.31,
           "goodput_following_advice": 0.37, "gain": 0.06, "gain_ci": 0.02}
    assert advice.lines(out)[-1].endswith("(95%) (n=3: wide)")
    assert advice.lines({**out, "replications": 10})[-1].endswith("(95%)")
    summary = [{"spares": "4", "n": 2, "goodput": 0.36, "goodput_ci": 0.45}]
    grid = report.sweep_grid(summary, ["spares"], "t", metrics=("goodput",))
    assert grid.rows == [("4", "0.360 [0.000, 0.810] (n=2: wide)")]


def test_plan_spares_default_range_contains_the_scenarios_own_spares() -> None:
    counts = spares.default_counts(32)
    assert 32 in counts and min(counts) == 0 and max(counts) == 64
    assert any(0 < c < 32 for c in counts)
    assert spares.default_counts(4) == [0, 1, 2, 4, 8]


@pytest.mark.slow
def test_plan_spares_shows_progress_when_piped(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    # no --spares: the counts tried span the scenario's own 6
    code = cli.main(["plan-spares", str(SMALL), "--set", "duration=3h", "--set", "spares=6",
                     "--replications", "1", "--goodput-floor", "0.01",
                     "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0
    assert "spare counts [0, 1, 3, 4, 6, 9, 12] (the scenario has 6)" in captured.out
    assert "plan-spares: 1/7 runs (spares 0)" in captured.err
    assert "plan-spares: 7/7 runs (spares 12)" in captured.err


def test_fit_warns_and_widens_intervals_on_thin_history() -> None:
    raw = xid79_raw(duration="3h")  # 20 nodes, ~0.25 faults per node-day: hours of history
    raw["failures"]["causes"]["gpu_off_bus"]["per_1000_node_days"] = 4000
    rows = twin.run(parse_scenario(raw)).rows
    f = fitting.fit(rows)
    assert f.warnings and "thin history" in f.warnings[0]
    assert f.confidence == fitting.THIN_CONFIDENCE
    cause = f.cause("gpu_off_bus")
    at_95 = fitting.poisson_interval(cause.count, cause.exposure_node_days)
    assert cause.per_node_day.high > at_95.high and cause.per_node_day.low < at_95.low
    lines = fitted.summary_lines(f)
    assert lines[0].startswith("WARNING: thin history")
    assert "99.9% exact Poisson interval" in "\n".join(lines)
    assert "WARNING: thin history" in fitted.to_scenario(f)["description"]
    assert fitting.thin_history(40 * 86_400.0, 960.0) == ()


@pytest.mark.slow
def test_replay_twin_maps_each_signal_of_a_cause_so_a_rule_change_shows_up(
        tmp_path: Path) -> None:
    # one cause, reported as XID 119 on some nodes and XID 79 on others (small.yaml's faulty
    # GPU): the fit took the first fault's signal (119) for all, so a candidate's XID 79 rule
    # never fired in the twin; each signal is now a weighted variant of the cause
    raw = xid79_raw(duration="2d")
    raw["failures"]["causes"] = {
        "gpu": {"per_1000_node_days": 150, "signal": {"xid": [79]}, "fix": "reboot"},
        "gsp": {"per_1000_node_days": 150, "signal": {"xid": [119]}, "fix": "reset_gpu"}}
    rows = json.loads(json.dumps(twin.run(parse_scenario(raw)).rows, default=str))
    for row in rows:  # the history names one cause for both
        for c in row["data"].get("conditions") or ():
            if (c.get("details") or {}).get("cause") == "gsp":
                c["details"]["cause"] = "gpu"
    f = fitting.fit(rows)
    assert [c.name for c in f.causes] == ["gpu"]
    variants = {tuple(sig["xid"]): (w, dict(fix)) for w, sig, fix in f.cause("gpu").variants}
    assert set(variants) == {(79,), (119,)}, variants
    fixes = {xid: max(fix, key=lambda k: fix[k]) for xid, (_, fix) in variants.items()}
    assert fixes == {(79,): "reboot", (119,): "reset_gpu"}, variants  # each its own fix
    assert sum(w for w, _ in variants.values()) == pytest.approx(1.0, abs=1e-3)
    spec = fitted.to_scenario(f)["failures"]["causes"]["gpu"]
    assert {tuple(v["signal"]["xid"]) for v in spec["variants"]} == {(79,), (119,)}
    text = DEFAULT_TABLE_PATH.read_text()
    row = "{codes: [79], failure_mode: gpu_fell_off_bus, severity: critical, action: reboot}"
    assert row in text
    policy = tmp_path / "xid79-replace"
    policy.mkdir()
    (policy / "triage_table.yaml").write_text(text.replace(row, row.replace("reboot",
                                                                            "replace")))
    diff = replay.twin_diff(rows, replay.load_policy(policy), replay.load_policy(None),
                            replications=2)
    assert diff["candidate_replacements"] > diff["baseline_replacements"]
