"""Availability modes and cost: a spot notice is a checkpoint-and-move through the real
control plane, queued capacity arrives after its wait, and the cost per useful GPU-hour is
node-hours billed x price over the accounting's productive GPU-hours."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.domain.health import (
    Condition,
    ConditionStatus,
    ConditionType,
    Diagnosis,
    HealthReport,
    RepairAction,
    Severity,
)
from shared.policies.repair import DecisionKind, PartitionView, RepairConfig, plan_repair
from shared.policies.triage import load_triage_table, triage
from simulator import cli, report, twin
from simulator.availability import AvailabilityCfg
from simulator.cost import CostInputs, cost_summary
from simulator.scenario import ScenarioError, parse_scenario

from .conftest import xid79_raw

HOUR = 3600.0
NOTICE = "mtc.node.health_reported.v1"


def quiet_raw(availability: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """Four job nodes and two spares, no hardware failures: only the availability acts."""
    raw = xid79_raw(duration="1d", availability=availability, **changes)
    raw["cluster"]["partitions"] = [{"name": "train", "nodes": 4, "spares": 2}]
    raw["jobs"][0]["nodes"] = 4
    raw["failures"] = {"causes": {}}
    return raw


def spot(notice: str, rate: float = 1.5) -> dict[str, Any]:
    return {"mode": "spot", "price_per_node_hour": 30.0,
            "spot": {"preemptions_per_node_day": rate, "notice": notice, "obtain": "20m"}}


def notices(result: twin.RunResult) -> list[tuple[float, str]]:
    return [(float(r["time"]), r["data"]["node_id"]) for r in result.rows
            if r["type"] == NOTICE and any(c["type"] == "PreemptionNotice"
                                           and c["status"] == "true"
                                           for c in r["data"]["conditions"])]


def test_the_triage_table_drains_and_replaces_on_a_preemption_notice() -> None:
    cond = Condition(ConditionType.PREEMPTION_NOTICE.value, ConditionStatus.TRUE,
                     "spot VM preemption notice", 100.0, {"notice_s": 30.0, "kind": "spot"})
    diagnosis = triage(HealthReport("n1", 100.0, (cond,)), (), 100.0, load_triage_table())
    assert diagnosis.action is RepairAction.REPLACE
    assert diagnosis.failure_mode == "preemption_notice"


@pytest.mark.parametrize(("mode", "out", "removed", "kind"), [
    ("preemption_notice", {"a"}, (), DecisionKind.REPAIR),  # the VM goes anyway: drain it
    ("preemption_notice", set(), (1.0, 2.0, 3.0), DecisionKind.REPAIR),
    ("gpu_fell_off_bus", {"a"}, (), DecisionKind.HOLD),  # a fault: the guard still holds
    ("gpu_fell_off_bus", set(), (), DecisionKind.REPAIR),
])
def test_the_blast_radius_guard_does_not_hold_a_node_the_provider_takes(
        mode: str, out: set[str], removed: tuple[float, ...], kind: DecisionKind) -> None:
    diagnosis = Diagnosis(mode, Severity.CRITICAL, RepairAction.REPLACE)
    view = PartitionView("p", 4, frozenset(out), removed)  # one node out allowed
    decision = plan_repair(diagnosis, (), view, "b", 10.0, RepairConfig())
    assert decision.kind is kind and decision.action is RepairAction.REPLACE


def test_a_spot_notice_is_a_checkpoint_and_move_before_the_node_goes() -> None:
    result = twin.run(parse_scenario(quiet_raw(spot("30s"))))
    cost = result.cost
    seen = notices(result)
    assert cost["preemptions"] >= 3 and cost["with_job"] >= 2
    assert cost["job_lost_progress"] == 0  # every job got off its node in time
    exits = [r for r in result.rows if r["type"] == "mtc.job.workers_exited.v1"]
    starts = [r for r in result.rows if r["type"] == "mtc.job.started.v1"]
    moved = 0
    for t, node in seen:
        att = next((s for s in reversed(starts) if float(s["time"]) <= t
                    and node in s["data"]["node_ids"]), None)
        if att is None:
            continue  # a spare (or a node between attempts) was preempted
        ended = next((e for e in exits if e["data"]["attempt"] == att["data"]["attempt"]),
                     None)
        if ended is None or float(ended["time"]) < t:
            continue  # that attempt had already ended
        # the workers checkpointed on SIGTERM (75) within the 30 s notice ...
        assert ended["data"]["exit_code"] == 75, ended
        assert float(ended["time"]) - t < 30.0
        # ... and the next attempt runs elsewhere
        nxt = next(s for s in starts if float(s["time"]) > float(ended["time"]))
        assert node not in nxt["data"]["node_ids"]
        moved += 1
    assert moved >= 2
    truth = result.truth["train"]
    assert truth["wasted_s"] == 0.0  # nothing computed was lost
    assert result.interruptions["spot_preemption"] == cost["with_job"]
    job = result.job()
    assert job.lost(cause="spot_preemption") > 0  # the accounting names the cause
    # the preempted VMs stopped billing; their replacements billed from when they existed
    assert cost["node_hours"] < 6 * result.horizon / HOUR


def test_a_notice_shorter_than_the_save_loses_the_progress_since_the_checkpoint() -> None:
    raw = quiet_raw(spot("5s", rate=3.0))
    raw["jobs"][0]["checkpoint_save"] = "20s"  # the save needs 20 s; the VM has 5
    result = twin.run(parse_scenario(raw))
    assert result.cost["job_lost_progress"] >= 1
    assert result.truth["train"]["wasted_s"] > 0
    assert result.job().lost(cause="spot_preemption") > 0


def test_queued_capacity_arrives_after_its_wait_and_the_wait_is_not_billed() -> None:
    raw = quiet_raw({"mode": "queued", "price_per_node_hour": 10.0,
                     "queued": {"wait": "3h", "replacements": False}})
    raw["cluster"]["provision"] = "5m"
    result = twin.run(parse_scenario(raw))
    assert result.ready_at >= 3 * HOUR + 5 * 60  # no node before the grant
    cost = result.cost
    assert cost["queue_wait_h"] == pytest.approx(3.0) and cost["queue_waits"] == 1
    # six VMs billed from the grant (boot included) to the end: not from the request
    assert cost["node_hours"] == pytest.approx(6 * (result.horizon - 3 * HOUR) / HOUR)
    assert cost["cost"] == pytest.approx(cost["node_hours"] * 10.0)
    on_demand = twin.run(parse_scenario(quiet_raw({"mode": "on_demand"})))
    assert on_demand.ready_at < HOUR


def test_the_cost_arithmetic_on_a_tiny_scenario() -> None:
    result = twin.run(parse_scenario(quiet_raw({"mode": "on_demand",
                                                "price_per_node_hour": 12.5})))
    cost = result.cost
    # no failures: every VM billed from its request (t = 0) to the end of the run
    assert cost["node_hours"] == pytest.approx(6 * result.horizon / HOUR)
    assert cost["cost"] == pytest.approx(cost["node_hours"] * 12.5)
    useful = result.accounting.fleet.productive_gpu_s / HOUR
    assert useful == pytest.approx(4 * 8 * result.job().productive_s / HOUR)
    assert cost["useful_gpu_hours"] == pytest.approx(useful)
    assert cost["cost_per_useful_gpu_hour"] == pytest.approx(cost["cost"] / useful)
    assert 0.9 * 24 * 32 < useful < 24 * 32  # a day of 32 GPUs, less startup and saves
    assert result.summary()["cost"]["cost"] == pytest.approx(cost["cost"], abs=1e-5)
    reserved = twin.run(parse_scenario(quiet_raw({"mode": "reservation",
                                                  "price_per_node_hour": 8.0,
                                                  "reservation": {"nodes": 10}})))
    # a reservation is billed for all its nodes for the whole run, used or not
    assert reserved.cost["node_hours"] == pytest.approx(10 * reserved.horizon / HOUR)
    assert reserved.cost["cost"] == pytest.approx(80 * reserved.horizon / HOUR)


@pytest.mark.parametrize(("mode", "metered", "expected_node_h"), [
    ("on_demand", 100.0, 100.0),
    ("spot", 100.0, 100.0),
    ("queued", 100.0, 100.0),
    ("reservation", 100.0, 6 * 50.0),  # 6 reserved nodes x 50 h, whatever ran
])
def test_billed_node_hours_by_mode(mode: str, metered: float, expected_node_h: float) -> None:
    out = cost_summary(AvailabilityCfg(mode=mode, price_per_node_hour=2.0, explicit=True),
                       CostInputs(metered, 50.0, 6, productive_gpu_s=40.0 * HOUR))
    assert out["node_hours"] == expected_node_h
    assert out["cost"] == 2.0 * expected_node_h
    assert out["cost_per_useful_gpu_hour"] == 2.0 * expected_node_h / 40.0


def test_without_a_price_the_cost_is_unknown_not_zero() -> None:
    out = cost_summary(AvailabilityCfg(explicit=True), CostInputs(10.0, 5.0, 2, 3600.0))
    assert out["cost"] is None and out["cost_per_useful_gpu_hour"] is None
    grid = report.cost_grid({**out, "preemptions": 0, "with_job": 0, "job_lost_progress": 0,
                             "queue_wait_h": 0.0, "queue_waits": 0})
    assert ("cost per useful GPU-hour", "unknown") in grid.rows


@pytest.mark.parametrize(("availability", "path"), [
    ({"mode": "spotty"}, "availability.mode"),
    ({"mode": "reservation", "spot": {"notice": "30s"}}, "availability.spot"),
    ({"mode": "spot", "spot": {"notic": "30s"}}, "availability.spot.notic"),
    ({"mode": "spot", "price_per_node_hour": -1}, "availability.price_per_node_hour"),
    ({"mode": "reservation", "reservation": {"nodes": 3}}, "availability.reservation.nodes"),
])
def test_a_bad_availability_block_names_the_field(availability: dict[str, Any],
                                                  path: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(quiet_raw(availability))
    assert str(err.value).startswith(path)


def test_a_sweep_reports_cost_per_useful_gpu_hour_and_null_without_a_price(
        tmp_path: Path) -> None:
    scenarios = Path(__file__).resolve().parents[2] / "simulator" / "scenarios"
    for name, priced in (("spot16", True), ("small", False)):
        out = tmp_path / name
        assert cli.main(["sweep", str(scenarios / f"{name}.yaml"), "--set", "duration=12h",
                         "--replications", "2", "--processes", "1", "--out", str(out)]) == 0
        data = json.loads((out / "summary.json").read_text())  # strict JSON: no NaN
        for run in data["runs"]:
            assert run["node_h"] > 0 and run["useful_gpu_h"] > 0
            if priced:
                assert run["cost"] == pytest.approx(run["node_h"] * 30.0)
                assert run["cost_per_useful_gpu_h"] == pytest.approx(
                    run["cost"] / run["useful_gpu_h"])
            else:
                assert run["cost"] is None and run["cost_per_useful_gpu_h"] is None
        mean = data["summary"][0]["cost_per_useful_gpu_h"]
        assert (mean is not None) is priced
