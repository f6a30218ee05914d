"""bench/stack_bench.py and bench/stack_load.py: the figures they report, from what they saw."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import stack_bench  # noqa: E402
import stack_load  # noqa: E402


def test_one_missing_drain_does_not_turn_the_later_samples_into_misses() -> None:
    tap = stack_bench.Tap()
    tap.drains = {"a": [10.2], "c": [30.5]}  # "b" never drained
    figures = stack_bench.drain_figures(tap, [("a", 10.0), ("b", 20.0), ("c", 30.0)],
                                        timeout_s=0.05)
    assert (figures["measured"], figures["missing"]) == (2, 1)
    assert figures["max_ms"] == 500.0


def test_api_figures_count_errors_by_status_and_retries() -> None:
    client = stack_load.ApiClient("http://x", "t", "p", "op", "p0", 0, 0.0, [])
    client.calls = [("list_jobs", "200", 0.1, 0), ("list_jobs", "200", 0.3, 1),
                    ("cancel_job", "503", 2.0, 2), ("cancel_job", "timeout", 30.0, 0)]
    api = stack_load.api_figures([client], seconds=2.0)
    assert (api["calls"], api["calls_per_s"], api["errors"], api["retried"]) == (4, 2.0, 2, 2)
    jobs, cancels = api["by_kind"]["list_jobs"], api["by_kind"]["cancel_job"]
    assert (jobs["errors"], jobs["p50_ms"], jobs["p99_ms"]) == ({}, 100.0, 300.0)
    assert cancels["errors"] == {"503": 1, "timeout": 1}
    assert api["by_kind"]["get_job"] == {"count": 0, "errors": {}, "retried": 0,
                                         "p50_ms": None, "p99_ms": None, "first_error": {}}
