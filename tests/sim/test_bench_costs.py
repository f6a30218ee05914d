"""Recovery costs fitted from a live `mtc bench recovery` run, and the twin playing the same
trace with them (``simulator.bench_costs``, ``services.cli.bench_twin``).

``data/bench-recovery-default.json`` is the live half of a real ``mtc bench recovery --target
both --json`` on the default trace (embedded default, 2 cores, load average 7-14)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.resilience.score import IncidentScore, RunScore
from simulator.bench_costs import (
    RecoveryCosts,
    fit_document,
    fitted_scenario,
    measured_inputs,
    trace_of,
)
from simulator.scenario import parse_scenario

DOC = Path(__file__).parent / "data" / "bench-recovery-default.json"


def _doc() -> dict[str, Any]:
    return dict(json.loads(DOC.read_text()))


def test_the_fit_takes_each_mode_detection_and_policy_input_from_the_live_run() -> None:
    costs = fit_document(_doc())
    # per mode: the median of fault-to-resumed less detection over its incidents
    assert costs.startup_in_place_s == pytest.approx(
        ((0.45332 - 0.20362) + (0.39208 - 0.00468)) / 2, abs=1e-4)
    assert costs.startup_s == pytest.approx(((3.96847 - 0.02244) + (6.36081 - 0.22384)) / 2,
                                            abs=1e-4)
    assert costs.startup_scale_down_s == pytest.approx(1.16815 - 0.21535, abs=1e-4)
    assert costs.startup_hot_swap_s is None and costs.warm("hot_swap") == costs.startup_s
    # detection per signal: XIDs (three), the lost heartbeat, the crashed rank's exit
    assert costs.detect_xid_s == pytest.approx(0.02244, abs=1e-4)
    assert costs.detect_heartbeat_s == pytest.approx(0.22384, abs=1e-4)
    assert costs.detect_exit_s == pytest.approx(0.20362, abs=1e-4)
    # what the live control plane measured and weighed
    assert costs.restore_durable_s == pytest.approx(0.001)  # 0.000916, the twin's floor
    assert costs.restore_peer_s == RecoveryCosts().restore_peer_s  # none measured: default
    assert (costs.sigterm_save, costs.tier_report_s, costs.exit_after_save_s) == \
        ("durable", 2.126, 0.099)
    assert costs.fitted["startup_in_place_s"] == 2 and costs.fitted["detect_xid_s"] == 3


def test_a_document_without_a_live_run_is_refused() -> None:
    doc = _doc()
    doc["runs"] = [{**doc["runs"][0], "target": "twin"}]
    with pytest.raises(ValueError, match="no live run"):
        fit_document(doc)


def test_the_policy_inputs_are_read_from_the_event_log() -> None:
    def row(t: float, kind: str, **data: Any) -> dict[str, Any]:
        return {"time": t, "type": f"mtc.job.{kind}.v1", "data": {"job_id": "j", **data}}

    rows = [row(1.0, "checkpoint_saved", attempt=1, tier="memory", step=5, saved_at=0.9),
            row(3.0, "checkpoint_saved", attempt=1, tier="memory", step=45, saved_at=2.9),
            row(5.0, "checkpoint_saved", attempt=1, tier="memory", step=85, saved_at=4.9),
            row(5.5, "signalled", attempt=1),
            row(5.6, "checkpoint_saved", attempt=1, tier="durable", step=90, saved_at=5.6),
            row(5.7, "workers_exited", attempt=1),
            row(9.0, "checkpoint_saved", attempt=2, tier="memory", step=95, saved_at=8.9)]
    assert measured_inputs(rows, "j") == {"tier_report_s": 2.0, "sigterm_save": "durable",
                                          "exit_after_save_s": pytest.approx(0.1)}
    assert measured_inputs(rows, "other") == {}


def test_sim_fit_writes_the_fitted_costs_into_the_scenario(tmp_path: Path) -> None:
    from services.cli.main import main

    out = tmp_path / "fitted.yaml"
    assert main(["sim", "fit", str(DOC), "-o", str(out)]) == 0
    raw = yaml.safe_load(out.read_text())
    costs = fit_document(_doc())
    rec = raw["recovery"]
    assert rec["startup_warm"] == pytest.approx(costs.startup_in_place_s)
    assert rec["startup_scale_down"] == pytest.approx(costs.startup_scale_down_s)
    assert rec["sigterm_save"] == "durable" and rec["min_replicas"] == 3
    assert raw["jobs"][0]["startup"] == pytest.approx(costs.startup_s)
    assert raw["control_plane"]["heartbeat_timeout"] == pytest.approx(costs.detect_heartbeat_s)
    assert len(raw["failures"]["scripted"]) == 5
    assert raw == fitted_scenario(_doc(), name="fitted")[0]
    scenario = parse_scenario(raw)  # a scenario the twin runs
    assert scenario.recovery is not None and scenario.recovery.sigterm_save == "durable"


def test_the_twin_chooses_the_live_runs_mode_for_every_incident() -> None:
    """The default trace with the recorded live run's fitted costs and policy inputs: the
    same mode per incident, each fault-to-resumed within 1.5x of the live one."""
    from services.cli.bench_report import twin_vs_live
    from services.cli.bench_twin import calibrate, run

    doc = _doc()
    live_doc = doc["runs"][0]
    live = RunScore(live_doc["label"], live_doc["target"], live_doc["job_id"],
                    tuple(IncidentScore(**i) for i in live_doc["incidents"]))
    trace = trace_of(doc)
    costs = calibrate(trace, fit_document(doc), live)
    rows = twin_vs_live([live, run(trace, costs=costs)])
    assert [(x["kind"], x["twin_mode"]) for x in rows] == \
        [(x["kind"], x["live_mode"]) for x in rows]
    assert [x["live_mode"] for x in rows] == \
        ["in_place", "in_place", "requeue", "requeue", "scale_down"]
    for x in rows:
        assert 1 / 1.5 <= x["twin_over_live"] <= 1.5, x


def test_without_live_costs_a_rigid_untiered_job_has_no_recovery_block() -> None:
    from simulator.bench_costs import recovery_block

    trace = trace_of(_doc())
    rigid = type(trace.job)(replicas=4, min_replicas=None, step_time_s=0.05,
                            checkpoint_every=20, steps=100)
    assert recovery_block(type(trace)(**{**vars(trace), "job": rigid}), RecoveryCosts()) is None
    block = recovery_block(trace, RecoveryCosts(tier_report_s=2.0))
    assert block is not None and block["tiers"] == ["memory", "peer", "durable"]
    assert block["peer_gb_s"] == pytest.approx(1e6 / 4 / 1.0 / 1e9)  # heard 1 s late


def test_the_save_on_sigterm_knobs_are_validated_and_default_to_the_old_behaviour() -> None:
    from simulator.readers import ScenarioError
    from simulator.recovery_config import parse_recovery

    cfg = parse_recovery({}, "recovery")
    assert cfg is not None and (cfg.sigterm_save, cfg.report_before_exit_s) == ("memory", 1.0)
    with pytest.raises(ScenarioError, match="sigterm_save"):
        parse_recovery({"sigterm_save": "disk"}, "recovery")
    cfg = parse_recovery({"sigterm_save": "durable", "report_before_exit": "100ms"}, "recovery")
    assert cfg is not None and (cfg.sigterm_save, cfg.report_before_exit_s) == ("durable", 0.1)
