"""Replication statistics for sweeps: the mean and its Student-t confidence interval, without
SciPy (Hill's 1970 series for the t quantile, Acklam's approximation of the normal quantile).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and the half-width of its Student-t confidence interval (and the std dev)."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(xs) / n
    if n == 1:
        return mean, math.nan, 0.0
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    sd = math.sqrt(var)
    return mean, t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n), sd


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (Hill 1970 approximation; exact enough for confidence intervals)."""
    z = _normal_quantile(p)
    if df >= 1e6:
        return z
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    v = float(df)
    t = z + g1 / v + g2 / v ** 2 + g3 / v ** 3 + g4 / v ** 4
    if df <= 2:  # exact closed forms where the series is poor
        if df == 1:
            return math.tan(math.pi * (p - 0.5))
        a = 4 * p * (1 - p)
        return (2 * p - 1) * math.sqrt(2 / a)
    return t


def _normal_quantile(p: float) -> float:
    """Acklam's rational approximation of the standard normal quantile."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - lo:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


# What each sweep metric can be: ratios lie in [0, 1], counts, hours and costs are not
# negative. An interval is clamped to these (a goodput of 0.36 ± 0.45 is [0, 0.81], never
# "below 0"); a metric not listed is left as the t interval gives it.
RATIOS = ("goodput", "ettr", "scheduling_goodput", "runtime_goodput", "program_goodput")
NON_NEGATIVE = ("interruptions", "restarts", "waiting_h", "recovery_h", "wasted_h", "save_h",
                "startup_restore_h", "replacements", "events", "node_h", "useful_gpu_h",
                "cost", "cost_per_useful_gpu_h", "preemptions", "queue_wait_h", "wall_s")
# Below this many replications the t quantile alone (12.7 at n=2, 4.3 at n=3, 2.8 at n=5)
# makes an interval wide whatever the spread: it is printed marked as such.
FEW_REPLICATIONS = 5


def bounds(metric: str) -> tuple[float, float]:
    """The range ``metric`` can take."""
    if metric in RATIOS:
        return 0.0, 1.0
    if metric in NON_NEGATIVE:
        return 0.0, math.inf
    return -math.inf, math.inf


def clamped(mean: float, half: float, metric: str) -> tuple[float, float]:
    """The interval mean ± half, clamped to what ``metric`` allows."""
    low, high = bounds(metric)
    return max(low, mean - half), min(high, mean + half)


def interval_text(mean: float, half: float, metric: str, n: int, digits: int = 3) -> str:
    """``mean ± half`` when inside the metric's range, ``mean [low, high]`` when clamped,
    marked ``(n=2: wide)`` when too few replications; only the mean when there is none."""
    if half != half:
        return f"{mean:.{digits}f}"
    low, high = clamped(mean, half, metric)
    if (low, high) == (mean - half, mean + half):
        text = f"{mean:.{digits}f} ± {half:.{digits}f}"
    else:
        text = f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
    return text + wide_mark(n)


def wide_mark(n: int) -> str:
    """`` (n=2: wide)`` under FEW_REPLICATIONS replications, else nothing."""
    return f" (n={n}: wide)" if n < FEW_REPLICATIONS else ""


def error_bars(means: Sequence[float], halves: Sequence[float],
               metric: str) -> list[list[float]]:
    """matplotlib's asymmetric ``yerr`` ([below], [above]) for mean ± half clamped to what
    ``metric`` allows: no bar below 0 or above 100%; NaN (one replication) draws none."""
    below: list[float] = []
    above: list[float] = []
    for mean, half in zip(means, halves, strict=True):
        if half != half:
            below.append(0.0)
            above.append(0.0)
            continue
        low, high = clamped(mean, half, metric)
        below.append(mean - low)
        above.append(high - mean)
    return [below, above]
