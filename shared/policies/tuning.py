"""Hyperparameter tuning, decided from the study's stored trials alone (pure, deterministic).

Nothing here keeps state between calls: every decision is rebuilt from the study spec and the
trials so far, so a handler that runs twice (a redelivered event) decides the same thing.

- ``suggest``: the parameters of trial number ``index`` (0-based). GRID_SEARCH walks the grid
  in order (mixed radix over the parameters as listed); RANDOM_SEARCH draws each parameter
  uniformly on its scale from a generator seeded by (seed, index); ALGORITHM_UNSPECIFIED
  (Vertex's default, Bayesian) rebuilds an optuna study with a TPE sampler seeded by
  (seed, index) from the finished trials (``create_trial`` + ``add_trial``) and asks it.
- ``should_stop``: automated early stopping of a running trial (median or decay curve).
- ``final_measurement`` / ``best_trial``: LAST_MEASUREMENT or BEST_MEASUREMENT, and the best.
- ``parse_metric_lines``: what ``cloudml-hypertune`` writes (one JSON object per line:
  ``{"timestamp", "trial", <metric tag>: "<value>", "global_step": "<n>", ...}``).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Value = float | int | str
DEFAULT_TAG = "training/hptuning/metric"  # hypertune's tag when the program names none
MEDIAN_MIN_COMPLETED = 3  # the median rule needs this many finished trials to compare with
DECAY_MIN_POINTS = 3  # the decay-curve rule needs this many measurements of the trial
MAX_GRID = 1_000_000  # a grid larger than this is refused (it could never be walked)


class SpecError(ValueError):
    """A study spec that cannot be run; ``field`` is the path under ``studySpec``."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}")
        self.field = field_path
        self.reason = reason


@dataclass(frozen=True)
class Param:
    parameter_id: str
    kind: str  # double | integer | categorical | discrete
    low: float = 0.0
    high: float = 0.0
    values: tuple[Value, ...] = ()
    scale: str = "UNIT_LINEAR_SCALE"

    def grid_points(self) -> tuple[Value, ...]:
        if self.kind == "integer":
            return tuple(range(int(self.low), int(self.high) + 1))
        return self.values


@dataclass(frozen=True)
class Study:
    metric_id: str
    maximize: bool
    params: tuple[Param, ...]
    algorithm: str = "ALGORITHM_UNSPECIFIED"
    selection: str = "LAST_MEASUREMENT"
    stopping: str = ""  # "" | median | decay


@dataclass(frozen=True)
class Measurement:
    step: int
    value: float
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class TrialView:
    """What the policy needs of a trial: its parameters, state and measurements."""

    parameters: Mapping[str, Value]
    state: str  # REQUESTED | ACTIVE | STOPPING | SUCCEEDED | INFEASIBLE
    measurements: tuple[Measurement, ...] = ()
    final: float | None = None
    trial_id: str = ""


@dataclass(frozen=True)
class Grid:
    sizes: tuple[int, ...] = field(default_factory=tuple)

    @property
    def total(self) -> int:
        return math.prod(self.sizes)


# ---------------------------------------------------------------- the spec


def study_from_json(spec: Mapping[str, Any]) -> Study:
    """The study of a ``studySpec`` in proto3 JSON (already checked field by field by the wire
    model); refuses what cannot be run, naming the field."""
    metrics = spec.get("metrics") or []
    if len(metrics) != 1:
        raise SpecError("metrics", "exactly one metric is supported (multi-objective studies "
                        "are not)")
    metric = metrics[0]
    if not metric.get("metricId"):
        raise SpecError("metrics[0].metricId", "is required")
    goal = metric.get("goal", "GOAL_TYPE_UNSPECIFIED")
    if goal not in ("MAXIMIZE", "MINIMIZE"):
        raise SpecError("metrics[0].goal", "must be MAXIMIZE or MINIMIZE")
    raw_params = spec.get("parameters") or []
    if not raw_params:
        raise SpecError("parameters", "at least one parameter is required")
    params = tuple(_param(p, f"parameters[{i}]") for i, p in enumerate(raw_params))
    ids = [p.parameter_id for p in params]
    for i, pid in enumerate(ids):
        if pid in ids[:i]:
            raise SpecError(f"parameters[{i}].parameterId", f"{pid!r} is listed twice")
    algorithm = spec.get("algorithm", "ALGORITHM_UNSPECIFIED")
    selection = spec.get("measurementSelectionType", "MEASUREMENT_SELECTION_TYPE_UNSPECIFIED")
    stopping = ("median" if "medianAutomatedStoppingSpec" in spec
                else "decay" if "decayCurveStoppingSpec" in spec else "")
    study = Study(metric["metricId"], goal == "MAXIMIZE", params, algorithm,
                  "BEST_MEASUREMENT" if selection == "BEST_MEASUREMENT" else "LAST_MEASUREMENT",
                  stopping)
    if algorithm == "GRID_SEARCH":
        grid(study)  # raises when there is no grid
    return study


def _param(raw: Mapping[str, Any], where: str) -> Param:
    pid = raw.get("parameterId") or ""
    if not pid:
        raise SpecError(f"{where}.parameterId", "is required")
    if raw.get("conditionalParameterSpecs"):
        raise SpecError(f"{where}.conditionalParameterSpecs", "conditional parameters are not "
                        "supported by mtc")
    kinds = [k for k in ("doubleValueSpec", "integerValueSpec", "categoricalValueSpec",
                         "discreteValueSpec") if k in raw]
    if len(kinds) != 1:
        raise SpecError(where, "needs exactly one of doubleValueSpec, integerValueSpec, "
                        "categoricalValueSpec, discreteValueSpec")
    kind = kinds[0]
    body = raw[kind]
    scale = raw.get("scaleType", "SCALE_TYPE_UNSPECIFIED")
    scale = "UNIT_LINEAR_SCALE" if scale == "SCALE_TYPE_UNSPECIFIED" else scale
    if kind in ("doubleValueSpec", "integerValueSpec"):
        low, high = float(body.get("minValue", 0)), float(body.get("maxValue", 0))
        if not (math.isfinite(low) and math.isfinite(high)):
            raise SpecError(f"{where}.{kind}", "minValue and maxValue must be finite")
        if low > high:
            raise SpecError(f"{where}.{kind}.maxValue", "must not be smaller than minValue")
        if scale != "UNIT_LINEAR_SCALE" and low <= 0:
            raise SpecError(f"{where}.scaleType", f"{scale} needs minValue > 0")
        return Param(pid, kind.removesuffix("ValueSpec"), low, high, (), scale)
    values = tuple(body.get("values") or [])
    if not values:
        raise SpecError(f"{where}.{kind}.values", "at least one value is required")
    if len(set(values)) != len(values):
        raise SpecError(f"{where}.{kind}.values", "values must be distinct")
    if kind == "discreteValueSpec":
        values = tuple(sorted(float(v) for v in values))
        if not all(math.isfinite(float(v)) for v in values):
            raise SpecError(f"{where}.{kind}.values", "values must be finite")
    return Param(pid, kind.removesuffix("ValueSpec"), 0.0, 0.0, values, scale)


def grid(study: Study) -> Grid:
    for i, p in enumerate(study.params):
        if p.kind == "double":
            raise SpecError(f"parameters[{i}].doubleValueSpec", "GRID_SEARCH needs discrete "
                            "points: use discreteValueSpec, integerValueSpec or "
                            "categoricalValueSpec")
    out = Grid(tuple(int(p.high - p.low) + 1 if p.kind == "integer" else len(p.values)
                     for p in study.params))
    if out.total > MAX_GRID:
        raise SpecError("parameters", f"the grid has {out.total} points; at most {MAX_GRID}")
    return out


def trial_budget(study: Study, max_trial_count: int) -> int:
    """How many trials the study runs: maxTrialCount, or the grid when it is smaller."""
    if study.algorithm == "GRID_SEARCH":
        return min(max_trial_count, grid(study).total)
    return max_trial_count


# ---------------------------------------------------------------- suggestions


def suggest(study: Study, trials: Sequence[TrialView], index: int, seed: int) -> dict[str, Value]:
    """The parameters of trial ``index``: the same answer for the same history, always."""
    if study.algorithm == "GRID_SEARCH":
        return _grid_point(study, index)
    if study.algorithm == "RANDOM_SEARCH":
        return _random_point(study, random.Random(f"{seed}:{index}"))
    return _bayesian_point(study, trials, index, seed)


def _grid_point(study: Study, index: int) -> dict[str, Value]:
    g = grid(study)
    if not 0 <= index < g.total:
        raise IndexError(f"the grid has {g.total} points; no point {index}")
    out: dict[str, Value] = {}
    rest = index
    for p, size in zip(reversed(study.params), reversed(g.sizes), strict=True):
        rest, digit = divmod(rest, size)
        out[p.parameter_id] = p.grid_points()[digit] if p.kind != "integer" else int(p.low) + digit
    return {p.parameter_id: out[p.parameter_id] for p in study.params}


def _random_point(study: Study, rng: random.Random) -> dict[str, Value]:
    out: dict[str, Value] = {}
    for p in study.params:
        if p.kind in ("categorical", "discrete"):
            out[p.parameter_id] = p.values[rng.randrange(len(p.values))]
            continue
        u = rng.random()
        if p.scale == "UNIT_LOG_SCALE":
            x = math.exp(math.log(p.low) + u * (math.log(p.high) - math.log(p.low)))
        elif p.scale == "UNIT_REVERSE_LOG_SCALE":  # dense near maxValue
            x = p.low + p.high - math.exp(math.log(p.low) + u * (math.log(p.high) - math.log(p.low)))
        else:
            x = p.low + u * (p.high - p.low)
        x = min(max(x, p.low), p.high)
        out[p.parameter_id] = round(x) if p.kind == "integer" else x
    return out


def _bayesian_point(study: Study, trials: Sequence[TrialView], index: int, seed: int
                    ) -> dict[str, Value]:
    import optuna
    from optuna.distributions import (
        BaseDistribution,
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists: dict[str, BaseDistribution] = {}
    for p in study.params:
        if p.kind in ("categorical", "discrete"):
            dists[p.parameter_id] = CategoricalDistribution(list(p.values))
        elif p.kind == "integer":
            dists[p.parameter_id] = IntDistribution(int(p.low), int(p.high),
                                                    log=p.scale != "UNIT_LINEAR_SCALE")
        else:
            dists[p.parameter_id] = FloatDistribution(p.low, p.high,
                                                      log=p.scale != "UNIT_LINEAR_SCALE")
    sampler = optuna.samplers.TPESampler(seed=(seed * 1_000_003 + index) % 2**32)
    opt = optuna.create_study(direction="maximize" if study.maximize else "minimize",
                              sampler=sampler)
    for t in trials:
        params = {k: _to_dist(study, k, v) for k, v in t.parameters.items() if k in dists}
        if len(params) != len(dists):
            continue
        if t.state == "SUCCEEDED" and t.final is not None and math.isfinite(t.final):
            opt.add_trial(create_trial(state=TrialState.COMPLETE, value=t.final, params=params,
                                       distributions=dists))
        elif t.state == "INFEASIBLE":
            opt.add_trial(create_trial(state=TrialState.FAIL, params=params,
                                       distributions=dists))
    asked = opt.ask(dists)
    return {p.parameter_id: _from_dist(p, asked.params[p.parameter_id]) for p in study.params}


def _to_dist(study: Study, pid: str, value: Value) -> Any:
    p = next(p for p in study.params if p.parameter_id == pid)
    if p.kind == "integer":
        return int(value)
    if p.kind in ("double", "discrete"):
        return float(value)
    return value


def _from_dist(p: Param, value: Any) -> Value:
    if p.kind == "integer":
        return int(value)
    if p.kind in ("double", "discrete"):
        return float(value)
    return str(value)


# ---------------------------------------------------------------- measurements


def parse_metric_lines(text: str, metric_id: str, start: float = 0.0) -> list[Measurement]:
    """hypertune's file: one JSON object per line; a line cut short by a writer is skipped.
    A report without the study's tag but with hypertune's default tag counts for the metric."""
    out: dict[int, Measurement] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        raw = row.get(metric_id, row.get(DEFAULT_TAG))
        try:
            value = float(raw)  # type: ignore[arg-type]  # None: TypeError, skipped
            step = int(float(row.get("global_step", 0) or 0))
            at = float(row.get("timestamp", start) or start)
        except (TypeError, ValueError, OverflowError):
            continue
        if math.isfinite(value):
            out[step] = Measurement(step, value, max(0.0, at - start))
    return [out[s] for s in sorted(out)]


def merge(old: Sequence[Measurement], new: Sequence[Measurement]) -> list[Measurement]:
    """hypertune rewrites its file from memory: a resumed program's file holds only what it
    reported since. Keep every step seen; a newer report of a step replaces the older."""
    by_step = {m.step: m for m in old}
    by_step.update({m.step: m for m in new})
    return [by_step[s] for s in sorted(by_step)]


def _better(study: Study, a: float, b: float) -> bool:
    return a > b if study.maximize else a < b


def _best_value(study: Study, values: Sequence[float]) -> float:
    return max(values) if study.maximize else min(values)


def final_measurement(study: Study, measurements: Sequence[Measurement]) -> Measurement | None:
    if not measurements:
        return None
    if study.selection == "BEST_MEASUREMENT":
        best = measurements[0]
        for m in measurements[1:]:
            if _better(study, m.value, best.value):
                best = m
        return best
    return measurements[-1]


def best_trial(study: Study, trials: Sequence[TrialView]) -> TrialView | None:
    done = [t for t in trials if t.state == "SUCCEEDED" and t.final is not None]
    best: TrialView | None = None
    for t in done:
        assert t.final is not None
        if best is None or _better(study, t.final, best.final):  # type: ignore[arg-type]
            best = t
    return best


# ---------------------------------------------------------------- early stopping


def should_stop(study: Study, trial: TrialView, others: Sequence[TrialView]) -> str:
    """Why ``trial`` (running) should stop early, or "" to let it run.

    - median (``medianAutomatedStoppingSpec``): at the trial's latest step s, its best value so
      far is worse than the median, over the finished trials (at least
      ``MEDIAN_MIN_COMPLETED``) that reported by step s, of each one's best value up to s;
    - decay curve (``decayCurveStoppingSpec``): from its last three measurements the trial's
      curve is extrapolated as a geometric decay of its improvements (ratio r of the last two
      improvements, 0 <= r < 1: asymptote = last + last improvement * r / (1 - r)); it stops
      when even that asymptote is worse than the best finished trial's final value. A curve
      still improving as fast (r >= 1) or getting worse is judged by its last value alone.
    """
    if not study.stopping or not trial.measurements:
        return ""
    done = [t for t in others if t.state == "SUCCEEDED" and t.measurements]
    if study.stopping == "median":
        step = trial.measurements[-1].step
        own = _best_value(study, [m.value for m in trial.measurements])
        peers = [_best_value(study, [m.value for m in t.measurements if m.step <= step])
                 for t in done if any(m.step <= step for m in t.measurements)]
        if len(peers) < MEDIAN_MIN_COMPLETED:
            return ""
        median = statistics.median(peers)
        if _better(study, median, own):
            return (f"median rule: best value {own:g} by step {step} is worse than the median "
                    f"{median:g} of {len(peers)} finished trials")
        return ""
    finals = [t.final for t in done if t.final is not None]
    if not finals or len(trial.measurements) < DECAY_MIN_POINTS:
        return ""
    a, b, c = (m.value for m in trial.measurements[-3:])
    sign = 1.0 if study.maximize else -1.0
    d1, d2 = sign * (b - a), sign * (c - b)  # improvements, positive when getting better
    predicted = c
    if d1 > 0 and 0 <= d2 < d1:
        r = d2 / d1
        predicted = c + sign * d2 * r / (1 - r)
    best = _best_value(study, finals)
    if _better(study, best, predicted):
        return (f"decay curve: the curve levels off near {predicted:g}, worse than the best "
                f"finished trial's {best:g}")
    return ""


def enumerate_grid(study: Study) -> list[dict[str, Value]]:
    """Every grid point in order (for tests and small grids)."""
    return [dict(zip([p.parameter_id for p in study.params], combo, strict=True))
            for combo in itertools.product(*(p.grid_points() for p in study.params))]
