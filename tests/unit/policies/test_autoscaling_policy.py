"""The autoscaler's decision: up at once (after a short cool-down), down only below the
target less its margin and after a longer cool-down, always within [min, max]."""

from __future__ import annotations

from shared.policies.autoscaling import (
    DEFAULT_PER_MINUTE,
    REQUEST_COUNT,
    ScalePolicy,
    ScaleState,
    desired,
    policy_of,
)

P = ScalePolicy(target_per_s=10.0, up_cooldown_s=5.0, down_cooldown_s=15.0, down_margin=0.25)


def state(replicas: int, load: float, *, since: float | None = 100.0, low: int = 1,
          high: int = 4) -> ScaleState:
    return ScaleState(replicas, load, 1000.0, None if since is None else 1000.0 - since,
                      low, high)


def test_a_load_over_the_target_scales_up_to_what_it_needs_within_max() -> None:
    assert desired(P, state(1, 25.0)) == 3
    assert desired(P, state(1, 500.0)) == 4
    assert desired(P, state(1, 25.0, since=None)) == 3  # never scaled: no cool-down


def test_up_waits_out_its_cool_down() -> None:
    assert desired(P, state(1, 25.0, since=2.0)) == 1
    assert desired(P, state(1, 25.0, since=5.0)) == 3


def test_down_only_below_the_margin_and_after_the_longer_cool_down() -> None:
    # 19 requests/s on 3 replicas: 2 would carry it at the target, not at 75% of it
    assert desired(P, state(3, 19.0)) == 3
    assert desired(P, state(3, 14.0)) == 2  # 14 / 7.5 -> 2
    assert desired(P, state(3, 14.0, since=10.0)) == 3
    assert desired(P, state(3, 0.0)) == 1  # never below min


def test_a_load_at_the_target_does_not_flap() -> None:
    counts = {desired(P, state(n, load)) for n in (2,) for load in (19.0, 20.0, 16.0)}
    assert counts == {2}


def test_bounds_that_changed_apply_at_once() -> None:
    assert desired(P, state(6, 0.0, since=0.0)) == 4
    assert desired(P, state(1, 0.0, since=0.0, low=2)) == 2


def test_the_request_count_spec_is_per_minute_and_others_fall_back() -> None:
    assert policy_of([{"metricName": REQUEST_COUNT, "target": 120}]).target_per_s == 2.0
    cpu = "aiplatform.googleapis.com/prediction/online/cpu/utilization"
    assert policy_of([{"metricName": cpu, "target": 60}]).target_per_s == DEFAULT_PER_MINUTE / 60
    assert policy_of([]).target_per_s == DEFAULT_PER_MINUTE / 60
