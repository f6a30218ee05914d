"""The recovery costs a tiered job pays at scale: a warm start per mode, the teardown and
communicator rebuild by GPU count, the largest rank's state, the background copies'
interference, a recovery that falls back, and a software fault that recurs after restarts;
and the spread of the results over their uncertain ranges (``--uncertainty``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.ports import Gang, LaunchGroup, RecoveryPlan
from simulator import sweep, twin, uncertainty
from simulator.recovery_config import parse_recovery, plan_for
from simulator.scenario import SCENARIO_DIR, load_scenario
from simulator.tiers import start_costs
from simulator.world import SimJob
from tests.sim.conftest import scenario, xid79_raw
from tests.sim.test_tiers import RECOVERY, tiered

GB = 1e9


def _plan(**change: Any) -> tuple[SimJob, Any]:
    cfg = parse_recovery({**RECOVERY, **change}, "recovery")
    assert cfg is not None
    job_cfg = scenario(xid79_raw()).jobs[0]
    job = SimJob(job_cfg, "train", plan=plan_for(cfg, job_cfg, 8), ckpt_step=100,
                 ckpt_tier="peer")
    return job, job_cfg


def _gang(nodes: int, plan: RecoveryPlan | None) -> Gang:
    ids = tuple(f"n{i}" for i in range(nodes))
    return Gang("train", 2, ids, (LaunchGroup(0, nodes, ("train",), ()),), "sim://c",
                "sim://m", "sim://t", plan)


def test_each_mode_has_its_warm_start_plus_a_rebuild_that_grows_with_the_gpus() -> None:
    job, _ = _plan(startup_warm="20s", startup_hot_swap="40s", startup_scale_down="70s",
                   rebuild_s_per_kgpu=5)
    rebuild = 5 * 128 / 1000  # 16 nodes x 8 GPUs
    got = {mode: start_costs(job, _gang(16, RecoveryPlan(mode, fresh)))[0]
           for mode, fresh in (("in_place", ()), ("hot_swap", ("n3",)), ("scale_down", ()))}
    assert got == pytest.approx({"in_place": 20 + rebuild, "hot_swap": 40 + rebuild,
                                 "scale_down": 70 + rebuild})
    assert got["in_place"] < got["hot_swap"] < got["scale_down"]


def test_the_largest_rank_blocks_the_snapshot_and_slows_its_nodes_copy() -> None:
    uniform, _ = _plan()
    skewed, _ = _plan(largest_rank_gb=4)
    shard = 8e9 * 14 / 128
    assert uniform.plan is not None and skewed.plan is not None
    assert uniform.plan.save_s == pytest.approx(shard / (10 * GB))
    assert skewed.plan.save_s == pytest.approx(4 * GB / (10 * GB))
    assert skewed.plan.restore_s["peer"] == pytest.approx((7 * shard + 4 * GB) / (12.5 * GB))


def test_background_copies_take_their_share_of_the_steps_while_they_run() -> None:
    free, _ = _plan()
    taxed, _ = _plan(copy_interference=0.2)
    assert free.plan is not None and taxed.plan is not None
    p = taxed.plan
    stolen = 0.2 * (p.lag_s["peer"] / p.every["peer"] + p.lag_s["durable"] / p.every["durable"])
    assert p.save_s == pytest.approx(free.plan.save_s + stolen)


def test_a_failed_warm_recovery_falls_back_cold_to_the_durable_entry() -> None:
    job, job_cfg = _plan(fallback_probability=0.5)
    job.tier_newest["durable"] = (40, 0.0)
    assert job.plan is not None
    gang = _gang(16, RecoveryPlan("in_place"))
    kept = start_costs(job, gang, u=0.9)
    assert kept == (pytest.approx(30.0), pytest.approx(job.plan.restore_s["peer"]), "peer")
    startup, restore, tier = start_costs(job, gang, u=0.1)
    tried = 30.0 + job.plan.restore_s["peer"]
    redo = (100 - 40) * job_cfg.step_time_s  # the steps since the durable entry, again
    assert tier == "durable" and restore == pytest.approx(job.plan.restore_s["durable"])
    assert startup == pytest.approx(tried + job_cfg.startup_s + redo)


def _bug_run(**recovery: Any) -> tuple[int, float]:
    result = twin.run(scenario(tiered([{"at": "1h", "node": 3, "cause": "software_bug"}],
                                      **recovery)), seed=1)
    return result.interruptions.get("software_bug", 0), result.truth["train"]["wasted_s"]


def test_a_software_fault_recurs_after_restarts_until_its_fix() -> None:
    once, wasted_once = _bug_run()
    loops, wasted_loops = _bug_run(recur_probability=1.0, recur_after="10m",
                                   recur_fixed_after="1h")
    assert once == 1
    # hit at 1 h, then 10 min into each restart (a restart takes under a minute) until
    # the fix an hour later: five more
    assert loops == 6
    assert wasted_loops > wasted_once


def test_the_draws_cover_every_stratum_of_every_input_and_repeat_with_the_seed() -> None:
    for sampling in uncertainty.SAMPLINGS:
        points = uncertainty.draws(8, sampling, seed=3)
        assert points == uncertainty.draws(8, sampling, seed=3)
        for spec in uncertainty.RANGES:
            strata = sorted(int((p[spec.key] - spec.low) / (spec.high - spec.low) * 8)
                            for p in points)
            assert strata == list(range(8)), spec.key
    assert uncertainty.draws(8, "lhs", seed=3) != uncertainty.draws(8, "lhs", seed=4)


def test_every_uncertain_input_has_a_source_and_the_scenario_takes_its_whole_range() -> None:
    path = SCENARIO_DIR / "llama3-tiers.yaml"
    for spec in uncertainty.RANGES:
        assert spec.source and spec.low < spec.high
        for value in (spec.low, spec.high, spec.best):
            load_scenario(path, {spec.key: value})  # a bad key or value raises


def test_the_band_the_best_case_and_durable_only_come_from_the_same_draws(
        tmp_path: Path) -> None:
    raw = tiered([{"at": "1h", "node": 3, "cause": "gpu_off_bus"},
                  {"at": "3h", "node": 5, "cause": "software_bug"}])
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    points = uncertainty.draws(3, "equal", seed=1)
    tasks = uncertainty.tasks(str(path), {}, (), points, 2, seed=1)
    assert len(tasks) == (3 * 2 + 1) * 2
    assert {t.seed for t in tasks} == {1, 2}  # the same failures in every case and draw
    summary = uncertainty.summarise(sweep.run_sweep(tasks, processes=1))
    assert set(summary) == {"realistic", "best", "durable"}
    for case in ("realistic", "durable"):
        ettr = summary[case]["ettr"]
        assert ettr["low"] <= ettr["central"] <= ettr["high"]
        assert ettr["noise_sd"] is not None  # two replications: the noise, beside the band
    assert summary["best"]["ettr"]["central"] >= summary["realistic"]["ettr"]["low"]
