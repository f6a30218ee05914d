"""The validation kit names the exact field path of whatever is wrong."""

from __future__ import annotations

import math
from typing import Any

import pytest

from shared.domain import validation as kit
from shared.domain.errors import ValidationError


def _error(fn: Any, *args: Any, **kwargs: Any) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        fn(*args, **kwargs)
    return err.value


def test_join_builds_dotted_and_indexed_paths() -> None:
    assert kit.join("", "jobSpec") == "jobSpec"
    assert kit.join("jobSpec", "workerPoolSpecs") == "jobSpec.workerPoolSpecs"
    assert kit.join(kit.join("jobSpec.workerPoolSpecs", 0), "replicaCount") == \
        "jobSpec.workerPoolSpecs[0].replicaCount"


def test_unknown_keys_are_named_with_their_path() -> None:
    err = _error(kit.only_keys, {"count": 1, "cuont": 2}, "xid.rules[0].confirm",
                 ("count", "window_s"))
    assert err.path == "xid.rules[0].confirm.cuont"
    assert err.reason == "unknown key (expected one of count, window_s)"
    kit.only_keys({"count": 1}, "x", {"count"})


def test_required_and_get_treat_null_as_absent() -> None:
    assert _error(kit.required, {"a": None}, "a", "top").path == "top.a"
    assert kit.required({"a": 0}, "a", "") == 0
    assert kit.get({"a": None}, "a", 5) == 5 and kit.get({}, "a") is None


def test_value_readers() -> None:
    assert kit.mapping(None, "s", optional=True) == {}
    assert _error(kit.mapping, [], "s").reason == "must be a mapping, got list"
    assert _error(kit.mapping, 3, "(body)", noun="an object").reason == \
        "must be an object, got int"
    assert kit.number(3, "n") == 3.0
    assert "must be a number" in _error(kit.number, True, "n").reason
    assert "finite" in _error(kit.number, math.inf, "n").reason
    assert kit.number(math.inf, "n", finite=False) == math.inf
    assert _error(kit.number, 2, "bus.duplicate", high=1).reason == "must be at most 1, got 2"
    assert _error(kit.integer, 0, "n", low=1).reason == "must be at least 1, got 0"
    assert "integer" in _error(kit.integer, 1.5, "n").reason
    assert kit.boolean(False, "b") is False
    assert _error(kit.boolean, "yes", "b").reason == "must be true or false, got 'yes'"
    assert _error(kit.text, "  ", "name").reason.startswith("must be a non-empty string")


def test_field_getters_check_json_types() -> None:
    wps = "jobSpec.workerPoolSpecs[0]"
    err = _error(kit.int_field, {"replicaCount": 0}, "replicaCount", wps, minimum=1)
    assert err.path == f"{wps}.replicaCount" and "at least 1" in err.reason
    assert "boolean" in _error(kit.int_field, {"n": True}, "n", "").reason
    assert kit.int_field({}, "n", "", required=False, default=4) == 4
    assert _error(kit.string, {"s": 7}, "s", "").reason == "must be a string, got int"
    assert _error(kit.string, {"s": " "}, "s", "").reason == "must not be empty"
    assert _error(kit.field, {}, "s", "p", str, required=True).reason == "is required"
    items = kit.list_field({"c": ["a", "b"]}, "c", "p", lambda v, path: (v, path))
    assert items == (("a", "p.c[0]"), ("b", "p.c[1]"))
    assert _error(kit.list_field, {"c": []}, "c", "p", lambda v, p: v).reason == \
        "must not be empty"
