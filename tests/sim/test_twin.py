"""The twin runs the real control plane: seeded, reproducible, and sensitive to its policies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from services.wiring.builder import build_deps
from shared.config import ControlPlaneConfig
from shared.domain.health import RepairAction, Severity
from shared.policies.triage import load_triage_table
from simulator import twin
from simulator.goodput import Badput
from simulator.jobs import EXIT_PREEMPTED
from simulator.scenario import Scenario, load_scenario
from tests.sim.conftest import scenario, xid79_raw

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "simulator" / "scenarios" / "small.yaml"


def with_xid79_action(sc: Scenario, action: RepairAction) -> twin.ControlPlaneConfig:
    table = load_triage_table()
    rules = dict(table.xid_rules)
    severity = Severity.INFO if action is RepairAction.NONE else Severity.WARNING
    rules[79] = replace(rules[79], action=action, severity=severity)
    return replace(twin.control_plane_config(sc), triage_table=replace(table, xid_rules=rules))


def test_handlers_are_built_through_bootstrap(xid79: Scenario,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return build_deps(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(twin, "build_deps", spy)
    tw = twin.Twin(xid79)
    assert calls and calls[0]["compute"] is tw.compute and calls[0]["publisher"] is tw.bus
    assert calls[0]["clock"] is tw.clock


def test_same_seed_same_summary_other_seed_other_summary(xid79: Scenario) -> None:
    a = twin.run(xid79, seed=5).summary()
    b = twin.run(xid79, seed=5).summary()
    c = twin.run(xid79, seed=6).summary()
    assert a == b
    assert a != c
    assert a["handler_errors"] == {} and a["dead_letters"] == 0
    assert a["interruptions"]["gpu_off_bus"] > 10  # the scenario does fail


@pytest.mark.slow
def test_runs_are_reproducible_across_processes_and_hash_seeds() -> None:
    code = ("import json,sys; from simulator import twin; "
            "from simulator.scenario import load_scenario; "
            f"sc = load_scenario({str(SMALL)!r}, {{'duration': '3d'}}); "
            "print(json.dumps(twin.run(sc, seed=3).summary(), sort_keys=True))")
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                              capture_output=True, text=True, timeout=120)
        outs.append(json.loads(proc.stdout))
    assert outs[0] == outs[1]


def without_offenders(config: ControlPlaneConfig) -> ControlPlaneConfig:
    return replace(config, restart=replace(config.restart, offender_count=0))


@pytest.mark.slow
def test_the_triage_table_decides_the_outcome() -> None:
    """The real triage table is in the loop: map XID 79 to NONE or RESTART_JOB and (with the
    repeat-offender backstop off) the broken node is never repaired, the job keeps
    restarting onto it until it gives up."""
    raw = xid79_raw(duration="2d")
    raw["jobs"][0]["max_restarts"] = 40
    sc = scenario(raw)
    base = twin.run(sc, seed=2)
    assert base.repairs.get("reboot", 0) >= 5
    assert base.job_states["train"] == "JOB_STATE_RUNNING" and base.job().ettr > 0.8
    none = twin.run(sc, seed=2,
                    config=without_offenders(with_xid79_action(sc, RepairAction.NONE)))
    restart = twin.run(sc, seed=2, config=without_offenders(
        with_xid79_action(sc, RepairAction.RESTART_JOB)))
    for changed in (none, restart):
        assert changed.repairs.get("reboot", 0) == 0
        assert changed.job_states["train"] == "JOB_STATE_FAILED"  # gave up after 40 restarts
        assert changed.restarts["train"] == 40 > 3 * base.restarts["train"]
        assert changed.job().productive_s < 0.5 * base.job().productive_s
    # RESTART_JOB goes through repair -> JobInterruptRequested; NONE never leaves triage
    interrupt = "mtc.job.interrupt_requested.v1"
    assert restart.bus["by_type"].get(interrupt, 0) > 0
    assert none.bus["by_type"].get(interrupt, 0) == 0


def test_repeat_offenders_catch_a_fault_the_triage_table_lets_through() -> None:
    """XID 79 mapped to NONE or RESTART_JOB leaves the broken node in service; the node is
    under the job's failed attempts again and again, so checkpoint_resume suspects it and
    hands it to repair (shared/policies/restarts.py): it is rebooted and the job survives."""
    raw = xid79_raw(duration="2d")
    raw["jobs"][0]["max_restarts"] = 40
    sc = scenario(raw)
    for action in (RepairAction.NONE, RepairAction.RESTART_JOB):
        run = twin.run(sc, seed=2, config=with_xid79_action(sc, action))
        assert run.repairs.get("reboot", 0) >= 5
        assert run.job_states["train"] == "JOB_STATE_RUNNING" and run.job().ettr > 0.8
        assert run.restarts["train"] < 20


def test_the_repair_ladder_decides_the_repairs() -> None:
    """Without a reboot rung, triage's REBOOT climbs to the next rung: reimage, an hour each."""
    base = twin.run(scenario(xid79_raw()), seed=4)
    raw = xid79_raw(control_plane={"repair": {"ladder": ["reset_gpu", "reimage", "replace"]}})
    no_reboot = twin.run(scenario(raw), seed=4)
    assert base.repairs.get("reboot", 0) > 10
    assert no_reboot.repairs.get("reboot", 0) == 0
    assert no_reboot.repairs.get("reimage", 0) > base.repairs.get("reimage", 0) + 10
    raw = xid79_raw(control_plane={"repair": {"ladder": ["replace"]}})
    replace_only = twin.run(scenario(raw), seed=4)
    assert replace_only.repairs.get("replace", 0) > 10
    assert replace_only.repairs.get("reboot", 0) == 0


def test_a_reset_does_not_fix_a_fault_that_needs_a_reboot() -> None:
    """Triage asks for a GPU reset (XID 48); the true fix is a reboot: the post-repair check
    fails and the real ladder climbs to a reboot."""
    raw = xid79_raw()
    raw["failures"]["causes"] = {"dbe": {"per_1000_node_days": 250,
                                         "signal": {"xid": [48], "ecc_dbe": 1},
                                         "fix": "reboot"}}
    result = twin.run(scenario(raw), seed=3)
    assert result.repairs["reset_gpu"] > 5
    assert result.repairs.get("reboot", 0) >= result.repairs["reset_gpu"] - 2
    modes = {r["data"]["failure_mode"] for r in result.rows
             if r["type"] == "mtc.node.diagnosed.v1"}
    assert modes & {"double_bit_ecc", "uncorrectable_ecc"}


def test_goodput_from_the_event_log_matches_the_job_model() -> None:
    result = twin.run(load_scenario(SMALL, {"duration": "4d"}), seed=9)
    jg = result.job()
    truth = result.truth["train"]
    assert jg.productive_s == pytest.approx(truth["kept_compute_s"], rel=1e-3)
    assert jg.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION) == pytest.approx(
        truth["wasted_s"], rel=1e-3, abs=1.0)
    assert jg.lost(Badput.PROGRAM_STARTUP) == pytest.approx(truth["startup_s"], abs=1.0)
    assert jg.lost(Badput.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME) == pytest.approx(
        truth["restore_s"], abs=1.0)
    assert jg.lost(Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME) == pytest.approx(
        truth["save_s"], rel=0.01)
    assert jg.nominal_s == pytest.approx(truth["kept_work_s"], rel=2e-3)
    # every second of the job is in exactly one place
    assert abs(jg.lost(Badput.OTHER)) < 1e-3
    held = jg.productive_s + jg.lost() - jg.lost(Badput.PROGRAM_SLOWDOWN)
    assert held == pytest.approx(jg.total_s)
    # and tied to a cause
    assert set(jg.by_cause()) >= {"checkpointing", "faulty_gpu"}


def test_hard_failures_kill_the_attempt_and_drains_checkpoint_first(xid79: Scenario) -> None:
    raw = xid79_raw()
    raw["failures"]["planned"] = {"per_day": 2}
    result = twin.run(scenario(raw), seed=1)
    exits = [r["data"] for r in result.rows if r["type"] == "mtc.job.workers_exited.v1"]
    codes = {e["exit_code"] for e in exits}
    assert EXIT_PREEMPTED in codes and 1 in codes
    assert any("cause=gpu_off_bus" in e["detail"] for e in exits if e["exit_code"] == 1)
    jg = result.job()
    graceful = [d for d in jg.disruptions if d.cause == "planned_maintenance"]
    assert graceful and all(d.graceful for d in graceful)
    assert jg.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION, "planned_maintenance") == 0
    assert jg.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION, "gpu_off_bus") > 0


def test_spares_turn_waiting_into_running() -> None:
    raw = xid79_raw()
    raw["cluster"]["partitions"][0]["spares"] = 0
    none = twin.run(scenario(raw), seed=8).job()
    some = twin.run(scenario(xid79_raw()), seed=8).job()
    assert none.lost(Badput.WAITING_FOR_CAPACITY) > 3600
    assert some.lost(Badput.WAITING_FOR_CAPACITY) < 60
    assert none.scheduling_goodput < some.scheduling_goodput


def test_a_noisy_bus_changes_nothing_that_matters() -> None:
    raw = xid79_raw(bus={"latency": {"median": "50ms"}, "duplicate": 0.3, "reorder": 0.3})
    result = twin.run(scenario(raw), seed=2)
    assert result.bus["duplicates"] > 100 and result.bus["reordered"] > 100
    assert result.bus["outcomes"]["duplicate"] > 100  # run_handler's idempotency held
    assert result.dead_letters == 0 and result.bus["gave_up"] == 0
    assert result.job().ettr > 0.8
    assert abs(result.job().lost(Badput.OTHER)) < 1e-3


def test_every_checkpoint_or_only_the_latest_gives_the_same_goodput() -> None:
    latest = twin.run(scenario(xid79_raw()), seed=6)
    every = twin.run(scenario(xid79_raw(checkpoint_events="all")), seed=6)
    assert every.bus["by_type"]["mtc.job.checkpoint_saved.v1"] > \
        2 * latest.bus["by_type"]["mtc.job.checkpoint_saved.v1"]
    assert every.job().ettr == pytest.approx(latest.job().ettr, abs=0.005)
    assert every.job().goodput == pytest.approx(latest.job().goodput, abs=0.005)


def test_lemons_are_replaced_by_the_lemon_rule() -> None:
    raw = xid79_raw(duration="10d")
    raw["failures"]["lemons"] = {"fraction": 0.25, "multiplier": 12}
    result = twin.run(scenario(raw), seed=3)
    lemon_reasons = [r for r in result.rows if r["type"] == "mtc.node.retired.v1"
                     and "lemon" in r["data"].get("reason", "")]
    assert lemon_reasons  # the real repair policy's lemon rule fired


def test_weibull_lifetimes_stragglers_and_a_finite_job() -> None:
    raw = xid79_raw(duration="8d")
    raw["failures"]["lifetime"] = {"distribution": "weibull", "shape": 0.7}
    raw["failures"]["stragglers"] = {"per_1000_node_days": 200, "ratio": 0.6}
    raw["failures"]["diurnal"] = {"amplitude": 0.05}
    raw["jobs"][0]["work"] = "2d"
    result = twin.run(scenario(raw), seed=5)
    assert result.job_states["train"] == "JOB_STATE_SUCCEEDED"
    jg = result.job()
    assert jg.lost(Badput.PROGRAM_SLOWDOWN) > 0 and jg.program_goodput < 0.4
    assert jg.nominal_s == pytest.approx(2 * 86400, rel=0.01)
    assert any(d.cause == "slow_node" for d in jg.disruptions)


def test_post_repair_checks_keep_since_while_they_pass_as_the_agent_does(
        xid79: Scenario) -> None:
    """The simulated agent reports as ``shared.probes.agent`` does: a condition's ``since``
    is when its status was first seen and stays while the status holds. Each round of checks
    (after provisioning or a repair: a fresh agent) stamps its conditions at its first pass,
    and every later pass of that round carries the same ``since``."""
    result = twin.run(xid79, seed=3)
    checks: dict[str, list[tuple[float, set[float]]]] = {}
    for row in result.rows:
        data = row["data"]
        if row["type"] == "mtc.node.health_reported.v1" \
                and data["source"] == "post-repair-check" \
                and all(c["status"] == "false" for c in data["conditions"]):
            checks.setdefault(data["node_id"], []).append(
                (data["observed_at"], {c["since"] for c in data["conditions"]}))
    kept = rounds = 0
    for reports in checks.values():
        stamp = None
        for observed_at, sinces in reports:
            assert len(sinces) == 1  # one round's conditions were all first seen together
            (since,) = sinces
            assert since <= observed_at
            if since == observed_at:  # a round's first pass
                rounds += 1
            else:  # a later pass of the same round: the first pass's stamp
                assert since == stamp
                kept += 1
            stamp = since
    assert rounds > len(checks)  # bring-up's rounds and at least one after a repair
    assert kept >= rounds  # each round passes more than once before the node returns
