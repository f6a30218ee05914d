"""Replication statistics for sweeps: the mean and its Student-t confidence interval, without
SciPy (Hill's 1970 series for the t quantile, Acklam's approximation of the normal quantile).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


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
