"""Exact intervals for what ``mtc sim fit`` estimates: a Poisson rate (Garwood's, from the
Gamma quantiles: "Fiducial limits for the Poisson distribution", Biometrika 28, 1936) and a
proportion (Wilson's score interval). Pure, no SciPy (the tests check against it).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

__all__ = ["THIN_CONFIDENCE", "Interval", "gamma_quantile", "poisson_interval", "thin_history",
           "wilson_interval"]



def _lower_gamma_p(a: float, x: float) -> float:
    """The regularized lower incomplete gamma function P(a, x) (series, or Lentz's continued
    fraction for the complement; Numerical Recipes 6.2)."""
    if x <= 0:
        return 0.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return total * math.exp(log_front)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return 1.0 - math.exp(log_front) * h


def gamma_quantile(q: float, shape: float) -> float:
    """x with P(shape, x) = q (unit scale), by bisection: exact to 1e-12 relative."""
    if not 0 < q < 1 or shape <= 0:
        raise ValueError("need 0 < q < 1 and shape > 0")
    lo, hi = 0.0, max(1.0, shape)
    while _lower_gamma_p(shape, hi) < q:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _lower_gamma_p(shape, mid) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def __contains__(self, x: object) -> bool:
        return isinstance(x, int | float) and self.low <= x <= self.high

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def poisson_interval(count: int, exposure: float, confidence: float = 0.95) -> Interval:
    """The rate ``count / exposure`` with its exact (Garwood) interval."""
    if exposure <= 0:
        raise ValueError("exposure must be positive")
    alpha = 1 - confidence
    low = gamma_quantile(alpha / 2, count) / exposure if count > 0 else 0.0
    high = gamma_quantile(1 - alpha / 2, count + 1) / exposure
    return Interval(count / exposure, low, high)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """A proportion with its Wilson score interval (z for ``confidence``, two-sided)."""
    if n == 0:
        return Interval(0.0, 0.0, 1.0)
    z = statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


# A history shorter than a day, or with fewer node-days than this, is thin: a rate from it
# is a few faults over minutes or hours (often injected, bursty, not the steady process the
# twin draws from), so 34,421 failures per 1,000 node-days "fitted" from minutes looked like
# a measurement. The fit warns, and its intervals are 99.9% instead of 95%.
THIN_WINDOW_S = 86_400.0
THIN_NODE_DAYS = 30.0
THIN_CONFIDENCE = 0.999


def thin_history(window_s: float, node_days: float) -> tuple[str, ...]:
    """Why a history is too thin to plan from (nothing when it is not)."""
    out = []
    if window_s < THIN_WINDOW_S:
        out.append(f"the history spans {window_s / 3600:.2g} h (under a day)")
    if node_days < THIN_NODE_DAYS:
        out.append(f"it holds {node_days:.2g} node-days (under {THIN_NODE_DAYS:g})")
    if not out:
        return ()
    return (f"thin history: {' and '.join(out)}; the rates are extrapolated from a few "
            f"faults and may be far off: intervals widened to {THIN_CONFIDENCE:.1%}",)
