"""SlowSpeedCheck: a fixed matrix multiply timed against the node type's baseline.

A slow node drags every synchronous step of its job (a straggler) without ever failing, so
only a timing against a known-good baseline catches it. Without a baseline for this node
type the check cannot judge, and says unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from shared.domain.health import Condition, ConditionType
from shared.probes.conditions import healthy, problem, unknown

CTYPE = ConditionType.SLOW_SPEED_CHECK.value


def time_matmul(size: int = 512, repeats: int = 3, seed: int = 0) -> float:
    """Best-of-``repeats`` seconds for one ``size``x``size`` float32 matmul (min is robust to
    a noisy neighbour; the same seed keeps the workload identical everywhere)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    np.matmul(a, b)  # warm-up: BLAS thread pool, page faults
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        np.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return best


def speed_condition(
    elapsed_s: float,
    baseline_s: float | None,
    now: float,
    *,
    min_ratio: float = 0.8,
    node_type: str = "",
) -> Condition:
    """ratio_to_baseline is speed relative to the baseline, baseline / elapsed: 1.0 is as fast
    as the node type should be, 0.5 is half speed (the scale triage's tiers use)."""
    if baseline_s is None or baseline_s <= 0:
        return _no_baseline(now, node_type)
    if elapsed_s <= 0:
        return unknown(CTYPE, now, f"speed check measured {elapsed_s:g}s, cannot compare")
    ratio = round(baseline_s / elapsed_s, 3)
    details = {
        "ratio_to_baseline": ratio,
        "elapsed_s": elapsed_s,
        "baseline_s": baseline_s,
        "min_ratio": min_ratio,
    }
    if ratio < min_ratio:
        return problem(CTYPE, now, f"speed check at {ratio:.2f}x of baseline speed", details)
    return healthy(CTYPE, now, f"speed check at {ratio:.2f}x of baseline speed", details)


def _no_baseline(now: float, node_type: str) -> Condition:
    label = f" for node type {node_type!r}" if node_type else ""
    return unknown(CTYPE, now, f"no speed baseline{label}")


def probe(
    now: float,
    *,
    baseline_s: float | None,
    min_ratio: float = 0.8,
    size: int = 512,
    node_type: str = "",
    timer: Callable[[int], float] | None = None,
) -> Condition:
    if baseline_s is None or baseline_s <= 0:
        # Nothing to compare against: do not burn CPU on a measurement nobody can judge.
        return _no_baseline(now, node_type)
    elapsed = (timer or time_matmul)(size)
    return speed_condition(elapsed, baseline_s, now, min_ratio=min_ratio, node_type=node_type)
