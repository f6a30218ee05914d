"""Checkpoint-interval formulas against hand-computed numbers, and their error cases."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.policies.checkpointing import (
    CheckpointPolicy,
    daly_interval,
    first_order_waste,
    meta_ettr,
    meta_ettr_at_scale,
    meta_job_mttf_s,
    observed_mtbf,
    recommend_interval,
    young_interval,
)

# delta = 50 s, M = 10,000 s: 2 * delta * M = 1e6, so sqrt is exactly 1000 s.
DELTA, MTBF = 50.0, 10_000.0


def test_young() -> None:
    assert young_interval(DELTA, MTBF) == pytest.approx(1000.0)
    assert young_interval(60.0, 10_800.0) == pytest.approx(1138.4199576606)


def test_daly() -> None:
    # ratio = delta / 2M = 1/400; sqrt = 1/20 -> 1000 * (1 + 1/60 + 1/3600) - 50
    assert daly_interval(DELTA, MTBF) == pytest.approx(966.9444444, rel=1e-9)


def test_daly_when_the_checkpoint_costs_two_mtbf_or_more() -> None:
    assert daly_interval(200.0, 100.0) == 100.0
    assert daly_interval(500.0, 100.0) == 100.0
    assert daly_interval(199.0, 100.0) != 100.0


def test_first_order_waste() -> None:
    # 50/1000 + (500 + 100)/10000 = 0.05 + 0.06
    assert first_order_waste(1000.0, DELTA, 100.0, MTBF) == pytest.approx(0.11)
    assert first_order_waste(1000.0, 0.0, 0.0, MTBF) == pytest.approx(0.05)


def test_meta_ettr() -> None:
    # N r = 1e-4/s; lost = 1e-4 * (600 + 900) = 0.15; (1 - 0.15) / (1 + 60/1800) = 25.5/31
    assert meta_ettr(1000, 1e-7, 600.0, 1800.0, 60.0) == pytest.approx(25.5 / 31)


def test_meta_ettr_is_floored_at_zero() -> None:
    assert meta_ettr(1000, 1e-6, 600.0, 1800.0, 60.0) == 0.0


def test_meta_job_mttf_halves_when_the_job_doubles() -> None:
    # 16,384 GPUs = 2,048 nodes at 6.5 failures per 1,000 node-days: 1000 / (6.5 x 2048) days
    assert meta_job_mttf_s(16_384, 6.5) / 3600 == pytest.approx(1.803, abs=0.001)
    assert meta_job_mttf_s(8_192, 6.5) == pytest.approx(2 * meta_job_mttf_s(16_384, 6.5))
    assert meta_job_mttf_s(12, 6.5) == meta_job_mttf_s(16, 6.5)  # a partial node is a node


def test_meta_ettr_at_scale_is_meta_ettr_at_the_node_count() -> None:
    rate = 6.5 / (1000 * 86_400)
    got = meta_ettr_at_scale(8_192, 6.5, interval_s=1800.0, write_time_s=30.0,
                             restart_overhead_s=190.0)
    assert got == pytest.approx(meta_ettr(1024, rate, 190.0, 1800.0, 30.0))
    sizes = [meta_ettr_at_scale(g, 6.5, interval_s=1800.0, write_time_s=30.0,
                                restart_overhead_s=190.0) for g in (8, 1024, 16_384, 131_072)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[-1] == 0.0  # 14 min MTTF, a 30 min interval: no progress in the first order
    with pytest.raises(ValueError):
        meta_ettr_at_scale(0, 6.5, interval_s=1800.0, write_time_s=30.0,
                           restart_overhead_s=190.0)


def test_observed_mtbf() -> None:
    times = [10.0, 20.0, 30.0, 5000.0, -1.0]
    assert observed_mtbf(times, 0.0, 3600.0) == pytest.approx(1200.0)
    assert observed_mtbf([], 0.0, 3600.0) is None
    assert observed_mtbf([4000.0], 0.0, 3600.0) is None


def test_recommend_uses_the_observed_mtbf() -> None:
    policy = CheckpointPolicy()
    # two interruptions in 20,000 s -> M = 10,000 s
    got = recommend_interval(DELTA, [5_000.0, 15_000.0], 0.0, 20_000.0, policy)
    assert got == pytest.approx(966.9444444)


def test_recommend_falls_back_to_the_default_mtbf() -> None:
    policy = CheckpointPolicy(default_mtbf_s=MTBF)
    assert recommend_interval(DELTA, [], 0.0, 20_000.0, policy) == pytest.approx(966.9444444)
    assert CheckpointPolicy().default_mtbf_s == pytest.approx(3.1 * 3600)


def test_recommend_is_clamped() -> None:
    policy = CheckpointPolicy(min_interval_s=60.0, max_interval_s=4 * 3600.0)
    assert recommend_interval(0.01, [], 0.0, 10.0, CheckpointPolicy(default_mtbf_s=100)) == 60.0
    assert recommend_interval(1000.0, [], 0.0, 10.0, CheckpointPolicy(default_mtbf_s=1e7)) == (
        policy.max_interval_s
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: young_interval(0.0, 100.0),
        lambda: young_interval(10.0, -1.0),
        lambda: young_interval(10.0, math.inf),
        lambda: daly_interval(-1.0, 100.0),
        lambda: daly_interval(1.0, 0.0),
        lambda: daly_interval(math.nan, 10.0),
        lambda: first_order_waste(0.0, 1.0, 1.0, 100.0),
        lambda: first_order_waste(10.0, -1.0, 1.0, 100.0),
        lambda: first_order_waste(10.0, 1.0, -1.0, 100.0),
        lambda: first_order_waste(10.0, 1.0, 1.0, 0.0),
        lambda: meta_ettr(0, 1e-7, 1.0, 10.0, 1.0),
        lambda: meta_ettr(True, 1e-7, 1.0, 10.0, 1.0),
        lambda: meta_ettr(10, -1e-7, 1.0, 10.0, 1.0),
        lambda: meta_ettr(10, 1e-7, 1.0, 0.0, 1.0),
        lambda: meta_ettr(10, 1e-7, 1.0, 10.0, -1.0),
        lambda: observed_mtbf([], 10.0, 10.0),
        lambda: CheckpointPolicy(min_interval_s=0.0),
        lambda: CheckpointPolicy(min_interval_s=100.0, max_interval_s=50.0),
        lambda: CheckpointPolicy(default_mtbf_s=-1.0),
        lambda: recommend_interval(0.0, [], 0.0, 10.0, CheckpointPolicy()),
    ],
)
def test_bad_inputs_raise_value_error(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="must"):
        call()


@given(
    st.floats(min_value=1.0, max_value=3600.0),
    st.floats(min_value=600.0, max_value=1e7),
)
def test_young_minimises_first_order_waste(delta: float, mtbf: float) -> None:
    tau = young_interval(delta, mtbf)
    best = first_order_waste(tau, delta, 0.0, mtbf)
    assert best <= first_order_waste(tau * 0.7, delta, 0.0, mtbf) + 1e-12
    assert best <= first_order_waste(tau * 1.4, delta, 0.0, mtbf) + 1e-12


@given(
    st.floats(min_value=1.0, max_value=3600.0),
    st.lists(st.floats(min_value=0.0, max_value=1e6), max_size=50),
)
def test_recommendation_stays_within_bounds(cost: float, times: list[float]) -> None:
    policy = CheckpointPolicy()
    got = recommend_interval(cost, times, 0.0, 1e6, policy)
    assert policy.min_interval_s <= got <= policy.max_interval_s
