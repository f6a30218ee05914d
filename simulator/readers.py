"""Readers for scenario files: the shared validation kit (``shared.domain.validation``) raising
:class:`ScenarioError`, plus what only scenarios have: human durations (``90s``, ``15m``,
``2h``, ``54d``, ``1y``, or plain seconds) and sampled quantities (:class:`Dist`).

A sampled quantity is either one value (fixed) or a mapping: ``{median: 15m, sigma: 0.5}``
(lognormal), ``{low: 5m, high: 20m}`` (uniform) or ``{mean: 1h}`` (exponential).

Both the scenario sections (``simulator.scenario``) and the failure model's section
(``simulator.failure_config``) read through this module, so neither imports the other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared.domain import validation as kit
from shared.domain.errors import ValidationError

TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 7 * 86_400.0,
              "y": 365 * 86_400.0, "ms": 0.001}
DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h|d|w|y)?\s*$")


class ScenarioError(ValidationError, ValueError):
    """A bad scenario: names the key path and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.args = (f"{path or '(scenario)'}: {reason}",)


@contextmanager
def _scenario_errors() -> Iterator[None]:
    """The kit's ValidationError, re-raised as the ScenarioError scenario callers expect."""
    try:
        yield
    except ScenarioError:
        raise
    except ValidationError as exc:
        raise ScenarioError(exc.path, exc.reason) from None


join = kit.join
get = kit.get


def mapping(value: Any, path: str) -> Mapping[str, Any]:
    """A mapping; an absent (``None``) section is an empty one."""
    with _scenario_errors():
        return kit.mapping(value, path, optional=True)


def only_keys(data: Mapping[str, Any], path: str, allowed: Iterable[str]) -> None:
    with _scenario_errors():
        kit.only_keys(data, path, allowed)


def number(value: Any, path: str, *, low: float | None = None, high: float | None = None) -> float:
    with _scenario_errors():
        return kit.number(value, path, low=low, high=high)


def integer(value: Any, path: str, *, low: int | None = None) -> int:
    with _scenario_errors():
        return kit.integer(value, path, low=low)


def text(value: Any, path: str) -> str:
    with _scenario_errors():
        return kit.text(value, path)


def boolean(value: Any, path: str) -> bool:
    with _scenario_errors():
        return kit.boolean(value, path)


def duration(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise ScenarioError(path, f"must be a duration like '15m', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = DURATION_RE.match(value)
        if not match:
            raise ScenarioError(path, f"must be a duration like '90s', '15m', '2h', '54d', "
                                      f"got {value!r}")
        seconds = float(match.group(1)) * TIME_UNITS[match.group(2) or "s"]
    else:
        raise ScenarioError(path, f"must be a duration like '15m', got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ScenarioError(path, f"must not be negative, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Dist:
    """A sampled non-negative quantity (a duration, in seconds, or a plain number)."""

    kind: str  # fixed | lognormal | uniform | exponential
    a: float  # value | median | low | mean
    b: float = 0.0  # - | sigma | high | -

    def sample(self, rng: np.random.Generator) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "lognormal":
            return float(self.a * math.exp(self.b * rng.standard_normal()))
        if self.kind == "uniform":
            return float(self.a + (self.b - self.a) * rng.random())
        return float(rng.exponential(self.a))

    def draws(self, rng: np.random.Generator, block: int = 512) -> Iterator[float]:
        """Samples as ``sample(rng)`` called again and again would give them (the same
        numbers, for a generator nothing else draws from), drawn from numpy a block at a
        time: a scalar draw costs a call into numpy each (the bus draws one per event)."""
        a, b, exp = self.a, self.b, math.exp
        while True:
            if self.kind == "fixed":
                yield a
            elif self.kind == "lognormal":
                for z in rng.standard_normal(block).tolist():
                    yield float(a * exp(b * z))
            elif self.kind == "uniform":
                for u in rng.random(block).tolist():
                    yield float(a + (b - a) * u)
            else:
                yield from rng.exponential(a, block).tolist()

    @property
    def mean(self) -> float:
        if self.kind == "lognormal":
            return self.a * math.exp(self.b * self.b / 2.0)
        if self.kind == "uniform":
            return (self.a + self.b) / 2.0
        return self.a

    @staticmethod
    def fixed(value: float) -> Dist:
        return Dist("fixed", value)


def dist(value: Any, path: str, *, as_duration: bool = True) -> Dist:
    read = duration if as_duration else (lambda v, p: number(v, p, low=0.0))
    if not isinstance(value, Mapping):
        return Dist("fixed", read(value, path))
    keys = set(value)
    if keys <= {"median", "sigma"} and "median" in keys:
        sigma = number(get(value, "sigma", 0.5), join(path, "sigma"), low=0.0)
        return Dist("lognormal", read(value["median"], join(path, "median")), sigma)
    if keys == {"low", "high"}:
        low = read(value["low"], join(path, "low"))
        high = read(value["high"], join(path, "high"))
        if high < low:
            raise ScenarioError(join(path, "high"), f"must not be below low ({low:g})")
        return Dist("uniform", low, high)
    if keys == {"mean"}:
        return Dist("exponential", read(value["mean"], join(path, "mean")))
    raise ScenarioError(path, "must be a value or one of {median[, sigma]}, {low, high}, "
                              f"{{mean}}; got keys {sorted(map(str, keys))}")

