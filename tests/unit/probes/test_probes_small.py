"""disk, speed and heartbeat: the small probes."""

from __future__ import annotations

import pytest

from shared.domain.health import ConditionStatus
from shared.probes import disk, speed
from shared.probes.heartbeat import heartbeat_condition

NOW = 1_796_000_000.0
T, F, U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def fake_usage(table: dict[str, tuple[int, int, int]]) -> disk.UsageFn:
    def usage(path: str) -> disk.Usage:
        if path not in table:
            raise FileNotFoundError(2, "No such file or directory", path)
        return disk.Usage(*table[path])

    return usage


def test_disk_pressure_reports_the_worst_mount() -> None:
    usage = fake_usage({"/": (100, 50, 50), "/scratch": (100, 95, 5)})
    cond = disk.probe(["/", "/scratch"], NOW, threshold=0.9, usage=usage)
    assert cond.status is T
    assert cond.details["mount"] == "/scratch"
    assert cond.details["used_fraction"] == 0.95
    assert cond.details["mounts"] == {"/": 0.5, "/scratch": 0.95}


def test_disk_below_threshold_is_healthy() -> None:
    cond = disk.probe(["/"], NOW, usage=fake_usage({"/": (100, 10, 90)}))
    assert cond.status is F and cond.details["used_fraction"] == 0.1


def test_disk_uses_space_available_to_users_like_df() -> None:
    # 100 total, 85 used, 5 free for users (10 reserved for root): df says 95%.
    cond = disk.probe(["/"], NOW, threshold=0.9, usage=fake_usage({"/": (100, 85, 5)}))
    assert cond.status is T and cond.details["used_fraction"] == pytest.approx(0.9444, abs=1e-4)


def test_unreadable_mount_makes_the_check_unknown_unless_another_is_full() -> None:
    usage = fake_usage({"/": (100, 10, 90)})
    cond = disk.probe(["/", "/scratch"], NOW, usage=usage)
    assert cond.status is U and "/scratch" in cond.reason
    full = fake_usage({"/": (100, 99, 1)})
    assert disk.probe(["/", "/scratch"], NOW, usage=full).status is T


def test_no_mounts_is_unknown() -> None:
    assert disk.probe([], NOW).status is U


def test_real_root_filesystem() -> None:
    cond = disk.probe(["/"], NOW, threshold=1.0)
    assert cond.status in (F, T)
    assert 0.0 <= cond.details["used_fraction"] <= 1.0


def test_speed_without_baseline_is_unknown_and_runs_nothing() -> None:
    def boom(size: int) -> float:
        raise AssertionError("must not run the workload")

    cond = speed.probe(NOW, baseline_s=None, node_type="a3-highgpu-8g", timer=boom)
    assert cond.status is U
    assert cond.reason == "no speed baseline for node type 'a3-highgpu-8g'"


def test_speed_ratio_to_baseline_is_relative_speed() -> None:
    cond = speed.probe(NOW, baseline_s=0.010, min_ratio=0.8, timer=lambda size: 0.0125)
    assert cond.status is F and cond.details["ratio_to_baseline"] == 0.8
    slow = speed.probe(NOW, baseline_s=0.010, min_ratio=0.8, timer=lambda size: 0.040)
    assert slow.status is T and slow.details["ratio_to_baseline"] == 0.25  # a quarter speed
    fast = speed.probe(NOW, baseline_s=0.010, timer=lambda size: 0.005)
    assert fast.status is F and fast.details["ratio_to_baseline"] == 2.0
    assert speed.speed_condition(0.0, 0.01, NOW).status is U


def test_real_matmul_is_timed() -> None:
    elapsed = speed.time_matmul(size=64, repeats=2)
    assert 0.0 < elapsed < 1.0


def test_heartbeat() -> None:
    never = heartbeat_condition(None, NOW, 30.0)
    assert never.status is U
    fresh = heartbeat_condition(NOW - 10, NOW, 30.0)
    assert fresh.status is F and fresh.since == NOW - 10
    assert fresh.details["silent_for_s"] == 10.0
    lost = heartbeat_condition(NOW - 45, NOW, 30.0)
    assert lost.status is T
    assert lost.since == NOW - 15  # when it crossed the timeout, stable on recomputation
    assert lost.details["silent_for_s"] == 45.0
    assert heartbeat_condition(NOW - 45, NOW + 100, 30.0).since == lost.since
