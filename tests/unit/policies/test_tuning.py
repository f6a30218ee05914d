"""shared.policies.tuning: grid, random and Bayesian suggestions, measurements, early stopping."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.policies import tuning as t

LR = {"parameterId": "lr", "doubleValueSpec": {"minValue": 0.001, "maxValue": 1.0},
      "scaleType": "UNIT_LOG_SCALE"}
MOM = {"parameterId": "momentum", "discreteValueSpec": {"values": [0.0, 0.5, 0.9]}}
OPT = {"parameterId": "opt", "categoricalValueSpec": {"values": ["sgd", "adam"]}}
LAYERS = {"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "3"}}


def spec(*params: dict[str, Any], algorithm: str = "ALGORITHM_UNSPECIFIED",
         goal: str = "MINIMIZE", **extra: Any) -> t.Study:
    return t.study_from_json({"metrics": [{"metricId": "loss", "goal": goal}],
                              "parameters": list(params), "algorithm": algorithm, **extra})


def done(params: dict[str, Any], value: float, steps: tuple[tuple[int, float], ...] = ()
         ) -> t.TrialView:
    ms = tuple(t.Measurement(s, v) for s, v in steps) or (t.Measurement(10, value),)
    return t.TrialView(params, "SUCCEEDED", ms, value)


def test_grid_walks_every_point_in_order() -> None:
    s = spec(MOM, OPT, LAYERS, algorithm="GRID_SEARCH")
    points = [t.suggest(s, [], i, 1) for i in range(t.grid(s).total)]
    assert t.grid(s).total == 18
    assert points == t.enumerate_grid(s)
    assert len({json.dumps(p, sort_keys=True) for p in points}) == 18
    assert points[0] == {"momentum": 0.0, "opt": "sgd", "layers": 1}
    assert points[1] == {"momentum": 0.0, "opt": "sgd", "layers": 2}
    assert t.trial_budget(s, 100) == 18 and t.trial_budget(s, 5) == 5


def test_grid_refuses_doubles_naming_the_field() -> None:
    with pytest.raises(t.SpecError) as exc:
        spec(MOM, LR, algorithm="GRID_SEARCH")
    assert exc.value.field == "parameters[1].doubleValueSpec"


def test_random_is_uniform_on_its_scale_and_reproducible() -> None:
    s = spec(LR, MOM, OPT, LAYERS, algorithm="RANDOM_SEARCH")
    draws = [t.suggest(s, [], i, 3) for i in range(400)]
    assert draws == [t.suggest(s, [], i, 3) for i in range(400)]
    assert draws != [t.suggest(s, [], i, 4) for i in range(400)]
    lrs = [float(d["lr"]) for d in draws]
    assert all(0.001 <= x <= 1.0 for x in lrs)
    # log scale: about a third below 0.01 (one decade of three); linear would give 1 %
    assert 0.2 < sum(x < 0.01 for x in lrs) / len(lrs) < 0.45
    assert {d["momentum"] for d in draws} == {0.0, 0.5, 0.9}
    assert {d["layers"] for d in draws} == {1, 2, 3}


def test_bayesian_is_deterministic_from_history_and_learns() -> None:
    s = spec({"parameterId": "x", "doubleValueSpec": {"minValue": -5, "maxValue": 5}})
    history: list[t.TrialView] = []
    for i in range(25):
        p = t.suggest(s, history, i, 11)
        assert p == t.suggest(s, history, i, 11)  # same history, same answer
        history.append(done(p, (float(p["x"]) - 2.0) ** 2))
    late = [abs(float(h.parameters["x"]) - 2.0) for h in history[15:]]
    assert min(late) < 0.5 and sorted(late)[len(late) // 2] < 2.0
    best = t.best_trial(s, history)
    assert best is not None and best.final == min(h.final for h in history if h.final is not None)


def test_bad_specs_name_the_field() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"metrics": [], "parameters": [LR]}, "metrics"),
        ({"metrics": [{"metricId": "m"}], "parameters": [LR]}, "metrics[0].goal"),
        ({"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}], "parameters": []}, "parameters"),
        ({"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
          "parameters": [{**LR, "doubleValueSpec": {"minValue": 0, "maxValue": 1}}]},
         "parameters[0].scaleType"),
        ({"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
          "parameters": [{"parameterId": "a", "doubleValueSpec": {"minValue": 2, "maxValue": 1}}]},
         "parameters[0].doubleValueSpec.maxValue"),
        ({"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}], "parameters": [MOM, MOM]},
         "parameters[1].parameterId"),
        ({"metrics": [{"metricId": "m", "goal": "MAXIMIZE"}],
          "parameters": [{**MOM, "conditionalParameterSpecs": [{"x": 1}]}]},
         "parameters[0].conditionalParameterSpecs"),
    ]
    for body, field in cases:
        with pytest.raises(t.SpecError) as exc:
            t.study_from_json(body)
        assert exc.value.field == field, body


def test_metric_lines_as_hypertune_writes_them() -> None:
    text = "\n".join([
        json.dumps({"timestamp": 105.0, "trial": "1", "loss": "0.5", "global_step": "10",
                    "checkpoint_path": ""}),
        json.dumps({"timestamp": 106.0, "trial": "1", "other": "9", "global_step": "11"}),
        '{"timestamp": 107.0, "loss": "0.2", "glo',  # cut short by the writer
        json.dumps({"timestamp": 108.0, "training/hptuning/metric": "0.25",
                    "global_step": "20"}),
    ])
    got = t.parse_metric_lines(text, "loss", start=100.0)
    assert got == [t.Measurement(10, 0.5, 5.0), t.Measurement(20, 0.25, 8.0)]
    merged = t.merge(got, [t.Measurement(20, 0.24, 9.0), t.Measurement(30, 0.1, 12.0)])
    assert [(m.step, m.value) for m in merged] == [(10, 0.5), (20, 0.24), (30, 0.1)]


def test_final_measurement_last_or_best() -> None:
    ms = [t.Measurement(1, 0.5), t.Measurement(2, 0.1), t.Measurement(3, 0.3)]
    assert t.final_measurement(spec(LR), ms) == ms[-1]
    best = spec(LR, measurementSelectionType="BEST_MEASUREMENT")
    assert t.final_measurement(best, ms) == ms[1]
    assert t.final_measurement(best, []) is None


def test_median_rule_stops_a_trial_worse_than_the_median_at_its_step() -> None:
    s = spec(LR, medianAutomatedStoppingSpec={})
    peers = [done({"lr": 0.1}, v, ((5, v + 0.5), (10, v))) for v in (0.1, 0.2, 0.3)]
    bad = t.TrialView({"lr": 0.9}, "ACTIVE", (t.Measurement(5, 2.0),))
    good = t.TrialView({"lr": 0.2}, "ACTIVE", (t.Measurement(5, 0.4),))
    assert "median" in t.should_stop(s, bad, peers)
    assert t.should_stop(s, good, peers) == ""  # 0.4 beats the median 0.7 at step 5
    assert t.should_stop(s, bad, peers[:2]) == ""  # too few finished trials to judge
    assert t.should_stop(spec(LR), bad, peers) == ""  # no stopping spec: never


def test_decay_curve_stops_a_curve_that_levels_off_above_the_best() -> None:
    s = spec(LR, decayCurveStoppingSpec={})
    best = [done({"lr": 0.1}, 0.1)]
    flattening = t.TrialView({"lr": 0.5}, "ACTIVE", (
        t.Measurement(1, 2.0), t.Measurement(2, 1.5), t.Measurement(3, 1.25)))  # -> 1.0
    steep = t.TrialView({"lr": 0.5}, "ACTIVE", (
        t.Measurement(1, 2.0), t.Measurement(2, 1.0), t.Measurement(3, 0.15)))
    assert "decay" in t.should_stop(s, flattening, best)
    assert t.should_stop(s, steep, best) == ""  # it could still beat the best
    assert t.should_stop(s, flattening, []) == ""  # nothing finished to compare with
    maximize = spec(LR, decayCurveStoppingSpec={}, goal="MAXIMIZE")
    rising = t.TrialView({"lr": 0.5}, "ACTIVE", (
        t.Measurement(1, 0.1), t.Measurement(2, 0.5), t.Measurement(3, 0.7)))  # -> 0.9
    assert "decay" in t.should_stop(maximize, rising, [done({"lr": 0.1}, 0.95)])
    assert t.should_stop(maximize, rising, [done({"lr": 0.1}, 0.85)]) == ""
