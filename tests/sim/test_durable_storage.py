"""The durable tier as the cluster's storage: the save and restore bandwidths derive from the
Lustre instance's tier and capacity, the job's share and the measured efficiencies; a faster
tier saves in less time and, in a run, keeps more of the job's time (ETTR) for less money per
useful GPU-hour; a value the derivation cannot use is refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from simulator import twin
from simulator.readers import ScenarioError
from simulator.recovery_config import parse_recovery, plan_for
from simulator.scenario import SCENARIO_DIR, load_scenario
from tests.sim.conftest import scenario, xid79_raw
from tests.sim.test_tiers import RECOVERY

STATE = 8e9 * 14  # RECOVERY's parameters x bytes per parameter
LUSTRE = {"lustre_mb_s_per_tib": 250, "capacity_tib": 100}


def _cfg(**storage: Any) -> Any:
    cfg = parse_recovery({**RECOVERY, "durable_storage": {**LUSTRE, **storage}}, "recovery")
    assert cfg is not None
    return cfg


def test_the_bandwidths_are_the_tier_times_capacity_share_and_efficiency() -> None:
    cfg = _cfg(job_share=0.5)
    peak = 250 * 100 / 1000  # GB/s: 25
    assert cfg.durable_gb_s == pytest.approx(peak * 0.5 * 0.16)  # the measured write share
    assert cfg.durable_restore_gb_s == pytest.approx(peak * 0.5 * 0.21)  # and read share
    job = scenario(xid79_raw()).jobs[0]
    plan = plan_for(cfg, job, 8)
    assert plan.lag_s["durable"] == pytest.approx(STATE / (cfg.durable_gb_s * 1e9))
    assert plan.restore_s["durable"] == pytest.approx(STATE / (cfg.durable_restore_gb_s * 1e9))


def test_a_faster_tier_saves_in_proportionally_less_time() -> None:
    job = scenario(xid79_raw()).jobs[0]
    slow = plan_for(_cfg(lustre_mb_s_per_tib=125), job, 8)
    fast = plan_for(_cfg(lustre_mb_s_per_tib=1000), job, 8)
    assert slow.lag_s["durable"] == pytest.approx(8 * fast.lag_s["durable"])
    assert slow.restore_s["durable"] == pytest.approx(8 * fast.restore_s["durable"])


def test_storage_replaces_the_given_bandwidth_and_without_it_nothing_changes() -> None:
    given = parse_recovery(RECOVERY, "recovery")
    assert given is not None and given.durable_storage is None
    assert given.durable_restore_gb_s is None and given.durable_gb_s == RECOVERY["durable_gb_s"]
    job = scenario(xid79_raw()).jobs[0]
    plan = plan_for(given, job, 8)
    assert plan.restore_s["durable"] == pytest.approx(plan.lag_s["durable"])  # one bandwidth
    assert _cfg().durable_gb_s != RECOVERY["durable_gb_s"]


@pytest.mark.parametrize(("change", "field"), [
    ({"lustre_mb_s_per_tib": 25}, "lustre_mb_s_per_tib"),  # the Dynamic tier
    ({"lustre_mb_s_per_tib": 300}, "lustre_mb_s_per_tib"),
    ({"capacity_tib": 1}, "capacity_tib"),  # under the tier's minimum (36,000 GiB)
    ({"job_share": 0}, "job_share"),
    ({"write_efficiency": 1.5}, "write_efficiency"),
    ({"speed": 1}, "speed"),
])
def test_a_value_it_cannot_use_is_refused_by_name(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError, match=f"recovery.durable_storage.{field}"):
        _cfg(**change)


@pytest.mark.slow  # two runs of the 2,080-node scenario, durable alone (~5 s each)
def test_a_faster_lustre_tier_buys_ettr_and_a_lower_cost_per_useful_gpu_hour() -> None:
    """The shipped what-if, durable alone (every save synchronous): the 1000 MB/s/TiB tier
    against the 125 one, the same failures."""
    def run(tier: int) -> tuple[float, float]:
        sc = load_scenario(SCENARIO_DIR / "llama3-lustre.yaml", {
            "recovery.durable_storage.lustre_mb_s_per_tib": tier,
            "recovery.tiers": "durable", "duration": "10d"})
        result = twin.run(sc, seed=3)
        return (result.accounting.jobs["llama3-405b"].ettr,
                result.cost["cost_per_useful_gpu_hour"])
    slow, fast = run(125), run(1000)
    assert fast[0] > slow[0] + 0.05
    assert fast[1] < slow[1]
