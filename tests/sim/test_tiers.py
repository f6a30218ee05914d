"""Checkpoint tiers in the twin: which tier an incident restores from, that no tier
saves faster than its bandwidth, and that the event-log accounting still agrees with the job
model's ledger."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shared.goodput.totals import Badput
from shared.ports import Gang, LaunchGroup, RecoveryPlan
from simulator import twin
from simulator.readers import ScenarioError
from simulator.recovery_config import parse_recovery, plan_for
from simulator.scenario import load_scenario
from simulator.tiers import _cut, start_costs, tiered_attempt
from simulator.world import Attempt, SimJob
from tests.sim.conftest import scenario, xid79_raw

RECOVERY = {"tiers": ["memory", "peer", "durable"], "parameters": 8e9,
            "bytes_per_parameter": 14, "memory_gb_s": 10, "peer_gb_s": 12.5,
            "durable_gb_s": 20, "memory_every": "2m", "durable_every": "30m",
            "startup_warm": "30s"}
# the costs these tests do not look at, off: one warm start for every mode, no rebuild, a
# uniform shard, copies that take nothing from the steps, no fallback, no recurrence
# (tests/sim/test_recovery_costs.py has each)
RECOVERY.update({"startup_hot_swap": "30s", "startup_scale_down": "30s",
                 "rebuild_s_per_kgpu": 0, "largest_rank_gb": 0, "copy_interference": 0,
                 "fallback_probability": 0, "recur_probability": 0})


def tiered(scripted: list[dict[str, Any]], **recovery: Any) -> dict[str, Any]:
    """The 16-node XID 79 job with no random faults, ``scripted`` ones, and tiers."""
    raw = xid79_raw(duration="6h")
    raw["failures"]["causes"] = {
        "gpu_off_bus": {"count": 0, "signal": {"xid": [79]}, "fix": "reboot"},
        "software_bug": {"count": 0, "signal": "none", "fix": "none"}}
    raw["failures"]["reference"] = {"nodes": 16, "days": 1}
    raw["failures"]["scripted"] = scripted
    raw["recovery"] = {**RECOVERY, **recovery}
    return raw


def restored_from(raw: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
    by_tier, tiers, _, _ = tiered_run(raw)
    return by_tier, tiers


def tiered_run(raw: dict[str, Any]) -> tuple[dict[str, float], list[str], list[str], float]:
    """(restore seconds by tier, tiers reported, modes chosen, startup seconds)."""
    result = twin.run(scenario(raw), seed=1)
    tiers = [r["data"].get("tier") for r in result.rows
             if r["type"] == "mtc.job.checkpoint_saved.v1"]
    modes = [r["data"]["mode"] for r in result.rows
             if r["type"] == "mtc.job.recovery_chosen.v1"]
    truth = result.truth["train"]
    return truth["restore_by_tier_s"], tiers, modes, truth["startup_s"]


@pytest.mark.parametrize(("cause", "mode"), [("software_bug", "in_place"),
                                             ("gpu_off_bus", "hot_swap")])
def test_the_policy_restarts_warm_in_place_or_onto_a_warm_spare(cause: str, mode: str) -> None:
    _, _, modes, startup = tiered_run(tiered([{"at": "1h", "node": 3, "cause": cause}]))
    assert modes == [mode]
    assert startup == pytest.approx(120.0 + 30.0)  # the first start cold, the restart warm


def test_a_node_loss_restores_from_the_peer_not_memory() -> None:
    by_tier, logged = restored_from(tiered([{"at": "1h", "node": 3, "cause": "gpu_off_bus"}]))
    # every tier's newest entry is reported (the policy's costs), the restore tier's last;
    # the ranks that stayed report the cut in memory, nothing newer
    assert logged[:3] == ["durable", "memory", "peer"]
    assert by_tier.get("peer", 0) > 0 and by_tier.get("memory", 0) == 0


def test_a_program_crash_restores_from_memory() -> None:
    by_tier, logged = restored_from(tiered([{"at": "1h", "node": 3, "cause": "software_bug"}]))
    # every tier's newest entry is reported, the one restored from last
    assert logged[:3] == ["durable", "peer", "memory"]
    assert by_tier.get("memory", 0) > 0 and by_tier.get("peer", 0) == 0


def test_durable_alone_is_plain_requeue_at_those_sizes() -> None:
    """``tiers: durable`` is today's twin, exactly, with the save and restore the sizes and
    the bandwidth give: 8e9 x 14 B at 20 GB/s is 5.6 s each way."""
    scripted = [{"at": "1h", "node": 3, "cause": "gpu_off_bus"},
                {"at": "3h", "node": 5, "cause": "software_bug"}]
    tiers = tiered(scripted, tiers="durable")
    today = tiered(scripted)
    del today["recovery"]
    today["jobs"][0].update(checkpoint_save=5.6, checkpoint_restore=5.6)
    a, b = twin.run(scenario(tiers), seed=2), twin.run(scenario(today), seed=2)
    assert scenario(tiers).jobs[0].checkpoint_save_s == pytest.approx(5.6)
    assert a.truth == b.truth
    assert a.job().ettr == b.job().ettr and a.events == b.events
    assert {k: v for k, v in a.summary().items() if k not in ("scenario", "timings")} == \
        {k: v for k, v in b.summary().items() if k not in ("scenario", "timings")}


def test_no_tier_saves_more_often_than_its_bandwidth_allows() -> None:
    # 16 nodes x 8 GPUs, 112 GB of state: 7 GB a node; at 0.05 GB/s the peer copy takes 140 s,
    # longer than the 60 s between snapshots: every third snapshot goes to the peer
    cfg = parse_recovery({**RECOVERY, "memory_every": "1m", "peer_gb_s": 0.05}, "recovery")
    assert cfg is not None
    job = scenario(xid79_raw()).jobs[0]
    plan = plan_for(cfg, job, 8)
    cycle = plan.interval_s + plan.save_s
    for tier in plan.tiers:
        assert plan.every[tier] * cycle >= plan.lag_s[tier]
    assert plan.lag_s["peer"] == pytest.approx(140.0)
    assert plan.every["peer"] == 3
    assert plan.restore_s["peer"] == pytest.approx(140.0)
    # a node lost 10 s after snapshot 6: that snapshot's peer copy is still in flight, the
    # cut is the one before (3), never the memory copy the node took with it
    att = Attempt(SimJob(job, "train", plan=plan), 1, tuple(f"n{i}" for i in range(16)), 0.0,
                  0.0, 0)
    assert _cut(plan, att, 6 * cycle + 10.0, 6, cycle, {"n3"}) == (3, "peer")
    assert _cut(plan, att, 6 * cycle + 150.0, 6, cycle, {"n3"}) == (6, "peer")
    assert _cut(plan, att, 6 * cycle + 10.0, 6, cycle, set()) == (6, "memory")
    # a node and its buddy (half the gang on) both lost: only durable is left
    assert _cut(plan, att, 6 * cycle + 150.0, 6, cycle, {"n3", "n11"})[1] == "durable"


def test_the_event_log_accounting_matches_the_job_model_with_tiers() -> None:
    raw = tiered([{"at": "1h", "node": 3, "cause": "gpu_off_bus"},
                  {"at": "3h", "node": 5, "cause": "software_bug"}])
    result = twin.run(scenario(raw), seed=2)
    jg = result.job()
    truth = result.truth["train"]
    assert jg.productive_s == pytest.approx(truth["kept_compute_s"], rel=1e-3)
    assert jg.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION) == pytest.approx(
        truth["wasted_s"], abs=1.0)
    assert jg.lost(Badput.PROGRAM_STARTUP) == pytest.approx(truth["startup_s"], abs=1.0)
    assert jg.lost(Badput.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME) == pytest.approx(
        truth["restore_s"], abs=0.1)
    assert jg.lost(Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME) == pytest.approx(
        truth["save_s"], abs=1.0)
    assert abs(jg.lost(Badput.OTHER)) < 1e-3


@pytest.mark.parametrize(("change", "field"), [
    ({"tiers": ["memory", "peer"]}, "recovery.tiers"),
    ({"tiers": ["peer", "durable"]}, "recovery.tiers"),
    ({"tiers": ["disk"]}, "recovery.tiers"),
    ({"mode": "teleport"}, "recovery.mode"),
    ({"peer_gb_s": 0}, "recovery.peer_gb_s"),
    ({"memory_every": "1s"}, "recovery.memory_every"),
    ({"spares": "lukewarm"}, "recovery.spares"),
    ({"min_replicas": 17}, "recovery.min_replicas"),
    ({"bogus": 1}, "recovery.bogus"),
])
def test_bad_recovery_settings_name_the_field(change: dict[str, Any], field: str) -> None:
    raw = tiered([])
    raw["recovery"].update(change)
    with pytest.raises(ScenarioError) as err:
        scenario(copy.deepcopy(raw))
    assert field in str(err.value)


def test_the_tiers_scenario_is_llama3_with_a_recovery_block() -> None:
    base, tiers = load_scenario(), load_scenario(
        load_scenario.__globals__["SCENARIO_DIR"] / "llama3-tiers.yaml")
    assert base.recovery is None and tiers.recovery is not None
    assert (tiers.jobs, tiers.failures, tiers.seed) == (base.jobs, base.failures, base.seed)
    durable = load_scenario(load_scenario.__globals__["SCENARIO_DIR"] / "llama3-tiers.yaml",
                            {"recovery.tiers": "durable"})
    assert durable.recovery is not None and durable.recovery.pinned is None
    # the plain requeue with the block's figures: 5.67 TB at 2 TB/s, every 15 minutes
    assert durable.jobs[0].checkpoint_save_s == pytest.approx(2.835)
    assert durable.jobs[0].checkpoint_restore_s == pytest.approx(2.835)
    assert durable.jobs[0].checkpoint_interval_s == 900.0


def _gang(nodes: int, plan: RecoveryPlan | None) -> Gang:
    ids = tuple(f"n{i}" for i in range(nodes))
    return Gang("train", 2, ids, (LaunchGroup(0, nodes, ("train",), ()),), "sim://c",
                "sim://m", "sim://t", plan)


@pytest.mark.parametrize(("plan", "spares", "warm"), [
    (None, "warm", False),  # a requeue: today's cold start
    (RecoveryPlan("in_place"), "cold", True),
    (RecoveryPlan("scale_down"), "cold", True),
    (RecoveryPlan("hot_swap", ("n3",)), "warm", True),  # onto a warm spare
    (RecoveryPlan("hot_swap", ("n3",)), "cold", False),  # the gang waits for a cold spare
    (RecoveryPlan("requeue"), "warm", False),
])
def test_startup_is_warm_for_nodes_that_stayed_and_warm_spares(
        plan: RecoveryPlan | None, spares: str, warm: bool) -> None:
    cfg = parse_recovery({**RECOVERY, "spares": spares}, "recovery")
    assert cfg is not None
    job_cfg = scenario(xid79_raw()).jobs[0]
    job = SimJob(job_cfg, "train", plan=plan_for(cfg, job_cfg, 8), ckpt_step=10,
                 ckpt_tier="peer")
    startup, restore, tier = start_costs(job, _gang(16, plan))
    assert startup == (30.0 if warm else job_cfg.startup_s)
    assert tier == "peer" and restore == pytest.approx(job.plan.restore_s["peer"])  # type: ignore[union-attr]


def test_a_scaled_down_gang_runs_at_its_share_of_the_pace() -> None:
    cfg = parse_recovery(RECOVERY, "recovery")
    assert cfg is not None
    job_cfg = scenario(xid79_raw()).jobs[0]
    job = SimJob(job_cfg, "train", plan=plan_for(cfg, job_cfg, 8), ckpt_step=10,
                 ckpt_tier="memory")
    att = tiered_attempt(job, _gang(12, RecoveryPlan("scale_down")), 100.0)
    assert att.scale == pytest.approx(12 / 16)
    assert att.ready == pytest.approx(100.0 + 30.0 + job.plan.restore_s["memory"])  # type: ignore[union-attr]
